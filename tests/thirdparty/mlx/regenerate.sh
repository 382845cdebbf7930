#!/usr/bin/env bash
# Rebuild the MLX corpus tests/data/mlx/ with the real mlx-lm (CPU build of mlx on Linux).
#
#   bash tests/thirdparty/mlx/regenerate.sh [VENV] [OUT]
#
# VENV defaults to .venv-mlx at the repo root and is created (pinned versions below) when it
# has no bin/python; OUT defaults to tests/data/mlx and is replaced whole (it must be absent,
# empty, or a previous output of this script, i.e. hold MANIFEST.json). Work files go to a temp
# dir that is removed on exit. ~1-2 min on 2 cores; no network needed once the venv exists.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-$REPO/.venv-mlx}"
OUT="${2:-$REPO/tests/data/mlx}"

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" transformers==5.25.0 \
        tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
fi

if [[ -e "$OUT" && ! -f "$OUT/MANIFEST.json" && -n "$(ls -A "$OUT" 2>/dev/null)" ]]; then
    echo "refusing to replace $OUT: not empty and not an output of this script" >&2
    exit 2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
t0=$(date +%s)
# make.py writes a fresh tree; OUT is only replaced once it succeeded.
"$VENV/bin/python" "$HERE/make.py" --out "$WORK/out" --work "$WORK"
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
cp -r "$WORK/out" "$OUT"
echo "corpus: $OUT ($(du -sh "$OUT" | cut -f1)), $(( $(date +%s) - t0 )) s"
