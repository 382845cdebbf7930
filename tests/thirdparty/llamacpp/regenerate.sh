#!/usr/bin/env bash
# Rebuild the whole GGUF corpus tests/data/llamacpp_gguf/ with llama.cpp's real converter.
# Needs the venv + source from install_venv.sh (run it first if /work/venvs/llamacpp is absent).
#
#   bash tests/thirdparty/llamacpp/regenerate.sh            # full matrix
#   FIXTURES="glm4_moe" bash tests/thirdparty/llamacpp/regenerate.sh   # subset (other runs kept)
#
# Run names: <fixture>__<outtype>__<mode>[__<diagnostic>].  A failing conversion is part of the
# corpus too (convert.json + convert.log record the error); the script itself exits 0 unless a
# step of its own breaks.  Serial on purpose (the machine has 2 cores); ~6 s per run.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
OUT="${OUT:-$REPO/tests/data/llamacpp_gguf}"
export LLAMACPP_VENV="${LLAMACPP_VENV:-/work/venvs/llamacpp}"
export LLAMACPP_SRC="${LLAMACPP_SRC:-/work/venvs/llamacpp-src}"
FIXTURES="${FIXTURES:-glm4_moe deepseek_v3 accept_deepseek_v3 qwen3_next qwen3_5_text accept_qwen3_next mimo}"
OUTTYPES="${OUTTYPES:-f32 bf16 q8_0}"
MODES="${MODES:-full no-mtp mtp}"

if [[ ! -x "$LLAMACPP_VENV/bin/python" || ! -f "$LLAMACPP_SRC/llama.cpp/convert_hf_to_gguf.py" ]]; then
    echo "missing venv/source: run VENV=$LLAMACPP_VENV SRC=$LLAMACPP_SRC bash $HERE/install_venv.sh" >&2
    exit 2
fi

mkdir -p "$OUT"
t0=$(date +%s)
for fx in $FIXTURES; do
    for ot in $OUTTYPES; do
        for mode in $MODES; do
            python3 "$HERE/convert.py" "$REPO/fixtures/$fx" "$OUT/${fx}__${ot}__${mode}" \
                --outtype "$ot" --mode "$mode" || true
        done
    done
done

# Diagnostic runs: each one switches off one workaround to record the converter's own error.
if [[ " $FIXTURES " == *" glm4_moe "* ]]; then
    fx=glm4_moe
    python3 "$HERE/convert.py" "$REPO/fixtures/$fx" "$OUT/${fx}__f32__full__no-tokenizer" --tokenizer none || true
    python3 "$HERE/convert.py" "$REPO/fixtures/$fx" "$OUT/${fx}__f32__full__untrimmed-vocab96" --trim-vocab no || true
    python3 "$HERE/convert.py" "$REPO/fixtures/$fx" "$OUT/${fx}__f32__full__no-tokpre-patch" --tokpre-fallback none || true
    python3 "$HERE/convert.py" "$REPO/fixtures/$fx" "$OUT/${fx}__f32__full__no-glm-specials" --glm-specials no || true
fi
if [[ " $FIXTURES " == *" accept_deepseek_v3 "* ]]; then
    python3 "$HERE/convert.py" "$REPO/fixtures/accept_deepseek_v3" "$OUT/accept_deepseek_v3__f32__full__no-tokpre-patch" --tokpre-fallback none || true
fi

# Split files: the converter's --split-max-tensors writes NAME-0000i-of-0000N.gguf shards.
if [[ " $FIXTURES " == *" glm4_moe "* ]]; then
    python3 "$HERE/convert.py" "$REPO/fixtures/glm4_moe" "$OUT/glm4_moe__bf16__full__split" --outtype bf16 --split-max-tensors 20 || true
fi
if [[ " $FIXTURES " == *" qwen3_next "* ]]; then
    python3 "$HERE/convert.py" "$REPO/fixtures/qwen3_next" "$OUT/qwen3_next__bf16__mtp__split" --outtype bf16 --mode mtp --split-max-tensors 10 || true
fi

# A merge beside its base's drafter (tests/data/peft): the stale-drafter check across formats.
if [[ " $FIXTURES " == *" glm4_moe "* ]]; then
    python3 "$HERE/convert.py" "$REPO/tests/data/peft/glm4_moe-lora-merged-mtp-copied-back" \
        "$OUT/peft_glm4_moe-mtp-copied-back__bf16__full" --outtype bf16 || true
fi

python3 "$HERE/summarize.py" "$OUT"
echo "corpus: $OUT ($(du -sh "$OUT" | cut -f1)), $(( $(date +%s) - t0 )) s"
