#!/usr/bin/env bash
# Regenerates the mergekit cases of tests/data/mergekit with mergekit's own mergekit-yaml and
# fill_missing_params (NOTES.md says what each case is):
#   bash tests/thirdparty/mergekit/regenerate.sh [VENV] [OUT]
# VENV (default .venv-mergekit at the repository root) gets torch 2.13.0 and mergekit 0.1.5 if
# it lacks them. OUT (default tests/data/mergekit) receives one folder per case; a VENV or OUT
# given on the command line is taken relative to the current directory.
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/../../.."
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
venv=.venv-mergekit
[ -n "${1:-}" ] && venv="$(abs "$1")"
out_root=tests/data/mergekit
[ -n "${2:-}" ] && out_root="$(abs "$2")"
if [ ! -x "$venv/bin/mergekit-yaml" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0 mergekit==0.1.5
fi
py="$venv/bin/python"
tools=tests/thirdparty/mergekit
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out_root"

# merge NAME SOURCE TWIN: mergekit-yaml's linear merge (linear.yml, weights 0.5/0.5) into $work/NAME
merge() {
  sed -e "s|TWIN|$3|" -e "s|SOURCE|$PWD/$2|" "$tools/linear.yml" > "$work/$1.yml"
  "$venv/bin/mergekit-yaml" "$work/$1.yml" "$work/$1" --allow-crimes > "$work/$1.log" 2>&1 \
    || { tail -n 20 "$work/$1.log"; exit 1; }
}
# ship CASE DIR FILE...: copies the named files of DIR into OUT/CASE, with versions.txt
ship() {
  local case="$1" dir="$2"
  shift 2
  local out="$out_root/$case"
  rm -rf "$out"
  mkdir -p "$out"
  for f in "$@"; do cp "$dir/$f" "$out/"; done
  "$venv/bin/pip" list 2>/dev/null | grep -i -E "^(mergekit|torch|transformers|safetensors) " > "$out/versions.txt"
  echo "wrote $out"
}

# deepseek_v3-linear: the fixture merged with an identical copy of itself
cp -r fixtures/deepseek_v3 "$work/twin"
merge linear fixtures/deepseek_v3 "$work/twin"
ship deepseek_v3-linear "$work/linear" config.json model.safetensors

# glm4_moe-linear: the same for the GLM-4.5 fixture
cp -r fixtures/glm4_moe "$work/glm4_moe-twin"
merge glm4_moe-linear fixtures/glm4_moe "$work/glm4_moe-twin"
ship glm4_moe-linear "$work/glm4_moe-linear" config.json model.safetensors

# deepseek_v3-linear-perturbed: the fixture merged with a twin whose decoder and MTP layers
# carry seeded noise; then fill_missing_params with the fixture as the base, as written
# (config.json and the index copied from the base, one model.safetensors) and without the
# copied index
"$py" "$tools/make_twin.py" fixtures/deepseek_v3 "$work/twin-layers" layers 0
merge merged-layers fixtures/deepseek_v3 "$work/twin-layers"
ship deepseek_v3-linear-perturbed "$work/merged-layers" config.json model.safetensors
"$py" "$tools/fill.py" fixtures/deepseek_v3 "$work/merged-layers" "$work/filled-layers" > "$work/fill-layers.log" 2>&1 \
  || { tail -n 20 "$work/fill-layers.log"; exit 1; }
ship deepseek_v3-linear-perturbed-filled "$work/filled-layers" \
  config.json model.safetensors model.safetensors.index.json
ship deepseek_v3-linear-perturbed-filled-noindex "$work/filled-layers" config.json model.safetensors

# deepseek_v3-linear-perturbed-all-filled-noindex: the same with a twin whose embedding, final
# norm and head carry noise too
"$py" "$tools/make_twin.py" fixtures/deepseek_v3 "$work/twin-all" all 0
merge merged-all fixtures/deepseek_v3 "$work/twin-all"
"$py" "$tools/fill.py" fixtures/deepseek_v3 "$work/merged-all" "$work/filled-all" > "$work/fill-all.log" 2>&1 \
  || { tail -n 20 "$work/fill-all.log"; exit 1; }
ship deepseek_v3-linear-perturbed-all-filled-noindex "$work/filled-all" config.json model.safetensors

# what each case holds next to the fixture, the twin and the merge it was filled from
d=fixtures/deepseek_v3
"$py" "$tools/describe.py" "$out_root/deepseek_v3-linear" "source=$d"
"$py" "$tools/describe.py" "$out_root/glm4_moe-linear" source=fixtures/glm4_moe
"$py" "$tools/describe.py" "$out_root/deepseek_v3-linear-perturbed" "source=$d" "twin=$work/twin-layers"
for c in deepseek_v3-linear-perturbed-filled deepseek_v3-linear-perturbed-filled-noindex; do
  "$py" "$tools/describe.py" "$out_root/$c" "source=$d" "twin=$work/twin-layers" "merge=$work/merged-layers"
done
"$py" "$tools/describe.py" "$out_root/deepseek_v3-linear-perturbed-all-filled-noindex" \
  "source=$d" "twin=$work/twin-all" "merge=$work/merged-all"
