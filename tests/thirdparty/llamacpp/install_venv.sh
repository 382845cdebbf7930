#!/usr/bin/env bash
# Build, from nothing, the venv that runs llama.cpp's real HF -> GGUF converter
# (convert_hf_to_gguf.py + its conversion/ package + gguf-py), taken from the
# llama-cpp-python sdist on PyPI.  No C/C++ is compiled: only the Python
# converter and the vendored gguf-py are used.
#
#   VENV=/work/venvs/llamacpp SRC=/work/venvs/llamacpp-src bash install_venv.sh
#
# Result:
#   $VENV                              python3.11 venv with exact pins below
#   $SRC/llama.cpp/convert_hf_to_gguf.py, conversion/, gguf-py/, requirements/, LICENSE
#   $SRC/VERSIONS.json                 llama-cpp-python version, sdist sha256, vendored llama.cpp commit
set -euo pipefail

VENV="${VENV:-/work/venvs/llamacpp}"
SRC="${SRC:-/work/venvs/llamacpp-src}"
PY="${PYTHON:-python3.11}"

LLAMA_CPP_PYTHON_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# From the sdist's CHANGELOG.md, entry [0.3.36]: "update llama.cpp to ggml-org/llama.cpp@0c1e57098"
# (the sdist has no .git, so this short hash is the only commit identifier it carries).
LLAMA_CPP_COMMIT=0c1e57098

# Exact pins (resolved 2026-12-02 on this machine's package index).
# Upstream requirements-convert_hf_to_gguf.txt asks torch==2.11.0, numpy~=2.2.6,
# transformers==4.57.6, protobuf<5; the fixtures' configs were written by transformers
# 5.24.0, so 5.24.0 is used instead (see NOTES.md).
PINS=(
  torch==2.13.0
  numpy==2.4.6
  sentencepiece==0.2.3
  transformers==5.24.0
  tokenizers==0.23.3
  huggingface_hub==2.4.0
  safetensors==0.8.0
  protobuf==4.25.9
  PyYAML==6.0.4
  tqdm==4.70.1
  requests==2.34.2
  Jinja2==3.1.6
)

t0=$(date +%s)

rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q "${PINS[@]}"

# --- converter source from the llama-cpp-python sdist --------------------------------
mkdir -p "$SRC"
dl="$SRC/dl"
rm -rf "$dl"; mkdir -p "$dl"
"$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$dl" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
tarball="$dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
echo "$SDIST_SHA256  $tarball" | sha256sum -c -
top="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
rm -rf "$SRC/llama.cpp"
mkdir -p "$SRC/llama.cpp"
tar -xzf "$tarball" -C "$dl" \
    "$top/CHANGELOG.md" \
    "$top/vendor/llama.cpp/convert_hf_to_gguf.py" \
    "$top/vendor/llama.cpp/conversion" \
    "$top/vendor/llama.cpp/gguf-py" \
    "$top/vendor/llama.cpp/requirements" \
    "$top/vendor/llama.cpp/LICENSE"
cp -r "$dl/$top/vendor/llama.cpp/." "$SRC/llama.cpp/"
cp "$dl/$top/CHANGELOG.md" "$SRC/llama-cpp-python-CHANGELOG.md"
rm -rf "$dl/$top"
grep -q "llama.cpp@$LLAMA_CPP_COMMIT" "$SRC/llama-cpp-python-CHANGELOG.md"

# gguf-py from the same vendored tree (version 0.19.0 in this sdist)
"$VENV/bin/pip" install -q --no-deps "$SRC/llama.cpp/gguf-py"

gguf_version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("gguf"))')
cat > "$SRC/VERSIONS.json" <<EOF
{
  "llama_cpp_python": "$LLAMA_CPP_PYTHON_VERSION",
  "sdist_sha256": "$SDIST_SHA256",
  "llama_cpp_commit": "$LLAMA_CPP_COMMIT",
  "gguf_py": "$gguf_version",
  "python": "$("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])')"
}
EOF

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as m
for p in ["torch", "numpy", "transformers", "tokenizers", "safetensors", "sentencepiece", "protobuf", "gguf"]:
    print(f"{p}=={m.version(p)}")
EOF

t1=$(date +%s)
echo "venv: $VENV  ($(du -sh "$VENV" | cut -f1))"
echo "src:  $SRC  ($(du -sh "$SRC" | cut -f1))"
echo "time: $((t1 - t0)) s"
