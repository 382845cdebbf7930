#!/usr/bin/env bash
# Regenerates the peft cases of tests/data/peft with the real peft (NOTES.md says what each is):
#   bash tests/thirdparty/peft/regenerate.sh [VENV] [OUT]
# VENV (default .venv-peft at the repository root) gets torch 2.13.0, then peft, transformers,
# accelerate and safetensors at the versions below, if it lacks peft. OUT (default
# tests/data/peft) receives one folder per case; a VENV or OUT given on the command line is
# taken relative to the current directory.
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/../../.."
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
venv=.venv-peft
[ -n "${1:-}" ] && venv="$(abs "$1")"
out_root=tests/data/peft
[ -n "${2:-}" ] && out_root="$(abs "$2")"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import peft" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q peft==0.21.2 transformers==5.25.0 accelerate==1.16.0 safetensors==0.8.0
fi
mkdir -p "$out_root"
for family in deepseek_v3 glm4_moe; do
  log="$(mktemp)"
  "$venv/bin/python" tests/thirdparty/peft/make.py "fixtures/$family" "$out_root" > "$log" 2>&1 \
    || { tail -n 20 "$log"; rm -f "$log"; exit 1; }
  # make.py's own lines (transformers' load report and the warnings go to the log only)
  grep -E "^(peft resolved|$family|  )" "$log" | grep -v "warnings.warn" || true
  rm -f "$log"
  for c in "$out_root/$family"-lora-merged-*; do
    "$venv/bin/pip" list 2>/dev/null | grep -i -E "^(peft|torch|transformers|accelerate|safetensors) " > "$c/versions.txt"
    echo "wrote $c"
  done
done
