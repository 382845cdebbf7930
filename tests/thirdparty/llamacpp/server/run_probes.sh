#!/usr/bin/env bash
# Run probe_server.py for the speculative-decoding configurations of llama-server that
# matter to mtpcheck, each with its own server process (always killed at the end).
#
#   [LLAMACPP_SERVER_BUILD=DIR] OUT=DIR \
#       bash tests/thirdparty/llamacpp/server/run_probes.sh [NAME...]
#
# NAME (default: all): ds_base ds_mtp ds_draft_self qwen_base qwen_mtp qwen_mtp_sidecar
#   ds_base           accept_deepseek_v3 f32 (deepseek2), no speculative decoding
#   ds_mtp            same, --spec-type draft-mtp (the GGUF has no NextN block: the
#                     converter drops DeepSeek-V3's MTP layer)
#   ds_draft_self     same, the same GGUF as its own draft: -md SAME --spec-type draft-simple
#   qwen_base         accept_qwen3_next f32 full, no speculative decoding
#   qwen_mtp          accept_qwen3_next f32 full (qwen3next, nextn block 2), --spec-type draft-mtp
#   qwen_mtp_sidecar  accept_qwen3_next f32 full + -md the --mtp GGUF (MTP head only),
#                     --spec-type draft-mtp
# Each writes $OUT/NAME.json and $OUT/NAME.server.log.
#
# Every run adds `--override-kv tokenizer.ggml.pre=str:kimi-k2`: the corpus GGUFs carry
# tokenizer.ggml.model="gpt2" without tokenizer.ggml.merges (WordLevel fixture tokenizer), and
# llama.cpp refuses them ("error loading model vocabulary: cannot find tokenizer merges in
# model file") unless the pre-tokenizer is "kimi-k2", the one BPE vocab allowed to have no
# merges (src/llama-vocab.cpp).  Prompts are sent as token ids, so text tokenisation is unused.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../../.." && pwd)"
BUILD="${LLAMACPP_SERVER_BUILD:-$REPO/.llama-server}"
SERVER="${LLAMA_SERVER:-$BUILD/build/bin/llama-server}"
OUT="${OUT:-${TMPDIR:-/tmp}/llamacpp-probes}"
PORT="${PORT:-18181}"
NMAX="${SPEC_DRAFT_N_MAX:-3}"
mkdir -p "$OUT"

G="$REPO/tests/data/llamacpp_gguf"
DS="$(ls "$G"/accept_deepseek_v3__f32__full/*.gguf)"
QW="$(ls "$G"/accept_qwen3_next__f32__full/*.gguf)"
QW_MTP="$(ls "$G"/accept_qwen3_next__f32__mtp/*.gguf)"
FDS="$REPO/fixtures/accept_deepseek_v3"
FQW="$REPO/fixtures/accept_qwen3_next"

names=("$@")
[[ ${#names[@]} -eq 0 ]] && names=(ds_base ds_mtp ds_draft_self qwen_base qwen_mtp qwen_mtp_sidecar)

for name in "${names[@]}"; do
    case "$name" in
        ds_base)          model=$DS; fx=$FDS; extra=() ;;
        ds_mtp)           model=$DS; fx=$FDS; extra=(--spec-type draft-mtp --spec-draft-n-max "$NMAX") ;;
        ds_draft_self)    model=$DS; fx=$FDS; extra=(-md "$DS" --spec-type draft-simple --spec-draft-n-max "$NMAX" --spec-draft-n-min 0) ;;
        qwen_base)        model=$QW; fx=$FQW; extra=() ;;
        qwen_mtp)         model=$QW; fx=$FQW; extra=(--spec-type draft-mtp --spec-draft-n-max "$NMAX") ;;
        qwen_mtp_sidecar) model=$QW; fx=$FQW; extra=(-md "$QW_MTP" --spec-type draft-mtp --spec-draft-n-max "$NMAX") ;;
        *) echo "unknown probe $name" >&2; exit 2 ;;
    esac
    echo "== $name"
    timeout 900 python3 "$HERE/probe_server.py" --server "$SERVER" --model "$model" \
        --fixture "$fx" --out "$OUT/$name.json" --port "$PORT" -- \
        --override-kv tokenizer.ggml.pre=str:kimi-k2 "${extra[@]}"
    echo "   rc=$?"
done
