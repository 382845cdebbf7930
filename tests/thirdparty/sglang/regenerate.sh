#!/usr/bin/env bash
# Regenerates tests/data/sglang with SGLang's own scripts/export_deepseek_nextn.py, run as
# published with its own command line (NOTES.md says what each case is):
#   bash tests/thirdparty/sglang/regenerate.sh [VENV] [OUT]
# VENV (default .venv-sglang at the repository root) gets torch 2.13.0 (CPU), safetensors 0.8.0
# and transformers 5.25.0 if it lacks them: the script imports nothing else (no sglang). OUT
# (default tests/data/sglang) receives one folder per case; a VENV or OUT given on the command
# line is taken relative to the current directory.
#
# Where the script comes from: the sdist sglang==$SGLANG_SDIST (default 0.5.10.post1, the newest
# sglang sdist on the package index; 0.5.23 is published as wheels only) is downloaded into a
# temporary folder and its scripts/export_deepseek_nextn.py is run from there when it has one.
# No sglang sdist checked so far has one (they hold the python/ package only, not the
# repository's scripts/), so then SGLANG_SRC must name an SGLang source tree (a clone of
# sgl-project/sglang): its scripts/export_deepseek_nextn.py is run in place, never copied into
# this repository. SGLANG_SRC, when set, is used even if the sdist has the script. The
# commit is recorded in versions.txt when SGLANG_SRC is a git clone; SGLANG_COMMIT overrides.
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/../../.."
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
venv=.venv-sglang
[ -n "${1:-}" ] && venv="$(abs "$1")"
out_root=tests/data/sglang
[ -n "${2:-}" ] && out_root="$(abs "$2")"
sdist="${SGLANG_SDIST:-0.5.10.post1}"
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, safetensors, transformers" 2>/dev/null; }; then
  python3 -m venv "$venv"
  echo '*' > "$venv/.gitignore"
  "$venv/bin/pip" install -q torch==2.13.0 safetensors==0.8.0 transformers==5.25.0
fi
py="$(cd "$venv" && pwd)/bin/python"
tools=tests/thirdparty/sglang
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out_root"

# the script: from the sdist when it has it, else (or when set) from SGLANG_SRC
script=""
sdist_note="$sdist (not downloaded)"
if "$venv/bin/pip" download -q "sglang==$sdist" --no-deps --no-binary :all: -d "$work/sdist" >"$work/sdist.log" 2>&1; then
  tar xzf "$work/sdist"/sglang-*.tar.gz -C "$work/sdist"
  found="$(find "$work/sdist" -path '*/scripts/export_deepseek_nextn.py' | head -n 1)"
  if [ -n "$found" ]; then
    script="$found"
    sdist_note="$sdist (scripts/export_deepseek_nextn.py taken from it)"
  else
    sdist_note="$sdist (downloaded; it has no scripts/export_deepseek_nextn.py)"
  fi
fi
if [ -n "${SGLANG_SRC:-}" ]; then
  src="$(abs "$SGLANG_SRC")"
  script="$src/scripts/export_deepseek_nextn.py"
  [ -f "$script" ] || { echo "no scripts/export_deepseek_nextn.py under SGLANG_SRC" >&2; exit 1; }
  commit="${SGLANG_COMMIT:-$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)}"
  origin="SGLang source tree (SGLANG_SRC) at commit $commit"
elif [ -n "$script" ]; then
  origin="sglang sdist $sdist"
else
  [ -d "$work/sdist" ] || tail -n 1 "$work/sdist.log" >&2
  echo "sglang sdist $sdist_note; set SGLANG_SRC to an SGLang source tree" >&2
  exit 1
fi
sha="$(sha256sum "$script" | cut -d' ' -f1)"
echo "running scripts/export_deepseek_nextn.py from $origin (sha256 $sha)"

# ship CASE DIR: copies every file the script wrote in DIR into OUT/CASE, with versions.txt
ship() {
  local out="$out_root/$1"
  rm -rf "$out"
  mkdir -p "$out"
  cp "$2"/* "$out/"
  chmod 644 "$out"/*
  {
    echo "sglang sdist: $sdist_note"
    echo "script: scripts/export_deepseek_nextn.py from $origin, sha256 $sha"
    "$venv/bin/pip" list 2>/dev/null | grep -i -E "^(torch|transformers|safetensors) "
  } > "$out/versions.txt"
  echo "wrote $out"
}
# export LOG ARGS...: runs the script with ARGS in the current folder, prints what it printed
# (the temporary folder shown as $WORK) and stops on a non-zero exit
export_nextn() {
  local log="$1"
  shift
  "$py" "$script" "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  sed "s|$work|\$WORK|g" "$log"
}

# deepseek_v3-nextn: the fixture as it is (2 main layers, the MTP layer at model.layers.2)
echo "== deepseek_v3-nextn"
export_nextn "$work/nextn.log" --input-dir fixtures/deepseek_v3 --output-dir "$work/deepseek_v3-nextn"
ship deepseek_v3-nextn "$work/deepseek_v3-nextn"

# deepseek_v3-nextn-skipped-shard: a copy of the fixture whose second shard (the one that holds
# the MTP layer) is cut to half its length, as an interrupted download leaves it; run in $work
# with the copy at fixtures/deepseek_v3 so that config.json's _name_or_path is the same
mkdir -p "$work/fixtures"
cp -r fixtures/deepseek_v3 "$work/fixtures/deepseek_v3"
"$py" -c "import os, sys; p = sys.argv[1]; os.truncate(p, os.path.getsize(p) // 2)" \
  "$work/fixtures/deepseek_v3/model-00002-of-00002.safetensors"
echo "== deepseek_v3-nextn-skipped-shard"
(cd "$work" && export_nextn skipped.log --input-dir fixtures/deepseek_v3 --output-dir deepseek_v3-nextn-skipped-shard)
ship deepseek_v3-nextn-skipped-shard "$work/deepseek_v3-nextn-skipped-shard"

for c in deepseek_v3-nextn deepseek_v3-nextn-skipped-shard; do
  "$py" "$tools/describe.py" "$out_root/$c" fixtures/deepseek_v3
done
