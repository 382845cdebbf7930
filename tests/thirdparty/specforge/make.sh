#!/usr/bin/env bash
# Regenerates tests/data/specforge with SpecForge 0.2.0's own draft config loader, draft class,
# vocab-mapping generator, checkpoint writer and `specforge export --to sglang` (NOTES.md says
# which call wrote what). Not run in CI: the install is ~215 packages (CUDA torch, sglang).
#   bash tests/thirdparty/specforge/make.sh [VENV] [OUT]
# VENV (default .venv-specforge at the repository root) gets specforge==0.2.0 if it lacks it.
# OUT (default tests/data/specforge) receives one folder per case; a VENV or OUT given on the
# command line is taken relative to the current directory.
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/../../.."
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
venv=.venv-specforge
[ -n "${1:-}" ] && venv="$(abs "$1")"
out_root=tests/data/specforge
[ -n "${2:-}" ] && out_root="$(abs "$2")"
if ! [ -x "$venv/bin/specforge" ]; then
  python3 -m venv "$venv"
  echo '*' > "$venv/.gitignore"
  "$venv/bin/pip" install -q specforge==0.2.0
fi
py="$venv/bin/python"
tools=tests/thirdparty/specforge
target=tests/data/speculators/llama-target
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out_root"

# run LOG CMD...: runs CMD with its output in $work/LOG, shown (tail) only on failure
run() {
  local log="$work/$1.log"
  shift
  "$@" > "$log" 2>&1 || { tail -n 30 "$log"; exit 1; }
}
# make CASE [AUX_IDS]: draft config + vocab mapping + training checkpoint, then SpecForge's
# export, then the exported config.json and model.safetensors into OUT/CASE with versions.txt
make_case() {
  local case="$1"
  shift
  run "$case-checkpoint" "$py" "$tools/make_checkpoint.py" "$target" "$work" "$case" "$@"
  run "$case-export" "$venv/bin/specforge" export --to sglang \
    --checkpoint "$work/$case/run" \
    --draft-config "$work/$case/draft_config.json" \
    --output-dir "$work/export/$case"
  local out="$out_root/$case"
  rm -rf "$out"
  mkdir -p "$out"
  cp "$work/export/$case/config.json" "$work/export/$case/model.safetensors" "$out/"
  chmod 644 "$out"/*
  {
    echo "exported by: specforge export --to sglang (specforge 0.2.0, CPU)"
    "$venv/bin/pip" list 2>/dev/null | grep -i -E "^(specforge|sglang|torch|transformers|safetensors|datasets) "
  } > "$out/versions.txt"
  echo "wrote $out"
}

make_case eagle3-native
make_case eagle3-native-aux 1,2,3
for c in eagle3-native eagle3-native-aux; do "$py" "$tools/describe.py" "$out_root/$c"; done
