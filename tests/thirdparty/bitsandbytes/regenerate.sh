#!/usr/bin/env bash
# Rebuild tests/data/bitsandbytes with the real bitsandbytes, through transformers and through
# bitsandbytes' own API (make.py; NOTES.md says what each case is):
#
#   bash tests/thirdparty/bitsandbytes/regenerate.sh [VENV] [OUT]
#
# VENV defaults to .venv-bitsandbytes at the repo root; it is (re)built with the pinned versions
# below when it lacks them (torch first, so pip keeps the CPU build). OUT defaults to
# tests/data/bitsandbytes and is replaced whole once the run succeeded (it must be absent, empty,
# or a previous output of this script, i.e. hold MANIFEST.json). No GPU; ~20 s on 2 cores; no
# network needed once the venv exists.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="$(realpath -m "${1:-$REPO/.venv-bitsandbytes}")"
OUT="$(realpath -m "${2:-$REPO/tests/data/bitsandbytes}")"
PINS=(bitsandbytes==0.50.2 transformers==5.25.0 accelerate==1.16.0 safetensors==0.8.0 numpy==2.4.6)

have_pins() {
    "$VENV/bin/python" - torch==2.13.0 "${PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if md.version(name).split("+")[0] != version:
        sys.exit(1)
PY
}
if [[ ! -x "$VENV/bin/python" ]] || ! have_pins; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q "${PINS[@]}"
fi

if [[ -e "$OUT" && ! -f "$OUT/MANIFEST.json" && -n "$(ls -A "$OUT" 2>/dev/null)" ]]; then
    echo "refusing to replace $OUT: not empty and not an output of this script" >&2
    exit 2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONHASHSEED=0
cd "$REPO"
"$VENV/bin/python" "$HERE/make.py" --out "$WORK/out" > "$WORK/log" 2>&1 || { tail -n 30 "$WORK/log"; exit 1; }
grep -v "^wrote " "$WORK/log" || true
"$VENV/bin/pip" list 2>/dev/null \
    | grep -i -E "^(torch|bitsandbytes|transformers|accelerate|safetensors|numpy|huggingface[-_]hub) " \
    > "$WORK/out/versions.txt"
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
cp -r "$WORK/out" "$OUT"
echo "wrote $OUT ($(du -sh "$OUT" | cut -f1))"
