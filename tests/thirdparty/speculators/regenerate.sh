#!/usr/bin/env bash
# Regenerates tests/data/speculators with speculators 0.9.0's own classes, converter and
# stitcher (NOTES.md says which call wrote each case and what each case is):
#   bash tests/thirdparty/speculators/regenerate.sh [VENV] [OUT]
# VENV (default .venv-speculators at the repository root) gets torch 2.13.0 and speculators
# 0.9.0 if it lacks them. OUT (default tests/data/speculators) receives one folder per case;
# a VENV or OUT given on the command line is taken relative to the current directory.
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/../../.."
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
venv=.venv-speculators
[ -n "${1:-}" ] && venv="$(abs "$1")"
out_root=tests/data/speculators
[ -n "${2:-}" ] && out_root="$(abs "$2")"
bash tests/thirdparty/speculators/install_venv.sh "$venv"
py="$venv/bin/python"
tools=tests/thirdparty/speculators
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out_root"

# run LOG CMD...: runs CMD with its output in $work/LOG, shown (tail) only on failure
run() {
  local log="$work/$1.log"
  shift
  "$@" > "$log" 2>&1 || { tail -n 30 "$log"; exit 1; }
}
# ship CASE DIR FILE...: copies the named files of DIR into OUT/CASE, with versions.txt
ship() {
  local case="$1" dir="$2"
  shift 2
  local out="$out_root/$case"
  rm -rf "$out"
  mkdir -p "$out"
  for f in "$@"; do cp "$dir/$f" "$out/"; done
  "$venv/bin/pip" list 2>/dev/null | grep -i -E "^(speculators|torch|transformers|safetensors) " > "$out/versions.txt"
  echo "wrote $out"
}

# the target (transformers' LlamaForCausalLM.save_pretrained) and, in other/, the same Llama
# with 300 tokens that the wrong-vocabulary drafter is trained against (not shipped)
run target "$py" "$tools/make_target.py" "$work/llama-target"
run target-300 "$py" "$tools/make_target.py" "$work/other/llama-target" 300
ship llama-target "$work/llama-target" config.json model.safetensors tokenizer.json tokenizer_config.json

# the drafters, written by speculators' classes (from_training_args / config + model class)
run drafters "$py" "$tools/make_drafters.py" "$work"
for c in eagle3 eagle3-no-aux-ids eagle3-wrong-vocab eagle3-4aux eagle3-shared-embed peagle dflash; do
  ship "$c" "$work/$c" config.json model.safetensors
done
# the two defects no speculators option writes: the smallest edits of eagle3's file
run no-d2t "$py" "$tools/edit.py" "$work/eagle3" "$work/eagle3-no-d2t" drop d2t t2d
ship eagle3-no-d2t "$work/eagle3-no-d2t" config.json model.safetensors
run random-embed "$py" "$tools/edit.py" "$work/eagle3" "$work/eagle3-random-embed" randn embed_tokens.weight 1
ship eagle3-random-embed "$work/eagle3-random-embed" config.json model.safetensors

# MTP: speculators' converter on the Qwen3-Next fixture (validated on CPU by the converter),
# then `speculators stitch-mtp` back into a copy of the fixture
run convert "$venv/bin/speculators" convert fixtures/qwen3_next --algorithm mtp \
  --verifier fixtures/qwen3_next --output-path "$work/mtp-qwen3next" --validate-device cpu
ship mtp-qwen3next "$work/mtp-qwen3next" config.json model.safetensors
run stitch "$venv/bin/speculators" stitch-mtp "$work/mtp-qwen3next" fixtures/qwen3_next \
  --output-path "$work/mtp-qwen3next-stitched"
ship mtp-qwen3next-stitched "$work/mtp-qwen3next-stitched" config.json model.safetensors

# what each case holds (tensor names, dtypes, shapes; "= target": bit-identical to the
# target's tensor of that name) and how speculators' own from_pretrained takes it back
drafters="eagle3 eagle3-no-aux-ids eagle3-no-d2t eagle3-random-embed eagle3-wrong-vocab eagle3-4aux eagle3-shared-embed peagle dflash"
"$py" "$tools/describe.py" "$out_root/llama-target"
for c in $drafters; do "$py" "$tools/describe.py" "$out_root/$c" --target "$out_root/llama-target"; done
for c in mtp-qwen3next mtp-qwen3next-stitched; do
  "$py" "$tools/describe.py" "$out_root/$c" --target fixtures/qwen3_next
done
"$py" "$tools/reload.py" "$out_root" $drafters mtp-qwen3next 2> "$work/reload.log"
