#!/usr/bin/env bash
# Regenerates tests/data/mergekit/deepseek_v3-linear with mergekit's own mergekit-yaml:
#   bash tests/thirdparty/mergekit/regenerate.sh [VENV]
# VENV (default .venv-mergekit) gets torch 2.13.0 and mergekit 0.1.5 if it lacks them.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${1:-.venv-mergekit}"
if [ ! -x "$venv/bin/mergekit-yaml" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0 mergekit==0.1.5
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r fixtures/deepseek_v3 "$work/twin"
sed -e "s|TWIN|$work/twin|" -e "s|SOURCE|$PWD/fixtures/deepseek_v3|" tests/thirdparty/mergekit/linear.yml > "$work/linear.yml"
"$venv/bin/mergekit-yaml" "$work/linear.yml" "$work/out" --allow-crimes > "$work/log" 2>&1 \
  || { tail -n 20 "$work/log"; exit 1; }
out=tests/data/mergekit/deepseek_v3-linear
rm -rf "$out"
mkdir -p "$out"
cp "$work/out/config.json" "$work/out/model.safetensors" "$out/"
"$venv/bin/pip" list 2>/dev/null | grep -i -E "^(mergekit|torch|transformers|safetensors) " > "$out/versions.txt"
echo "wrote $out"
