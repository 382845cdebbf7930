#!/usr/bin/env bash
# Rebuild the K-quant corpus tests/data/llamacpp_kquant/ with llama.cpp's own tools:
# convert_hf_to_gguf.py writes the wide GLM-4.5 fixture as BF16, then llama.cpp's
# llama-quantize (built here from the same llama-cpp-python sdist) stores it as Q4_K_M, which
# mixes Q4_K, Q6_K and F32 tensors. Only the Q4_K_M file is kept (the BF16 one is an
# intermediate).
#
#   bash tests/thirdparty/llamacpp/quantize.sh
#
# Needs the converter venv of install_venv.sh (LLAMACPP_VENV, LLAMACPP_SRC as there), cmake
# and a C/C++ compiler. The llama-quantize build goes to $LLAMACPP_BUILD (default
# /work/venvs/llamacpp-build): 18 minutes on 2 cores shared with a test run, once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
OUT="${OUT:-$REPO/tests/data/llamacpp_kquant}"
export LLAMACPP_VENV="${LLAMACPP_VENV:-/work/venvs/llamacpp}"
export LLAMACPP_SRC="${LLAMACPP_SRC:-/work/venvs/llamacpp-src}"
BUILD="${LLAMACPP_BUILD:-/work/venvs/llamacpp-build}"
VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
FIXTURE="$OUT/glm4_moe_wide"
RUN="glm4_moe_wide__q4_k_m"

quantize="$BUILD/tree/build/bin/llama-quantize"
if [[ ! -x "$quantize" ]]; then
    # the whole vendored llama.cpp (install_venv.sh keeps only its Python converter)
    rm -rf "$BUILD" && mkdir -p "$BUILD/dl"
    "$LLAMACPP_VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$BUILD/dl" \
        "llama-cpp-python==$VERSION"
    tarball="$BUILD/dl/llama_cpp_python-$VERSION.tar.gz"
    echo "$SDIST_SHA256  $tarball" | sha256sum -c -
    tar -xzf "$tarball" -C "$BUILD/dl"
    mv "$BUILD/dl/llama_cpp_python-$VERSION/vendor/llama.cpp" "$BUILD/tree"
    cmake -S "$BUILD/tree" -B "$BUILD/tree/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$BUILD/cmake.log"
    cmake --build "$BUILD/tree/build" --target llama-quantize -j "$(nproc)" >> "$BUILD/cmake.log"
fi

# the fixture itself, as make_wide_fixture.py writes it (transformers' own model, saved)
"$LLAMACPP_VENV/bin/python" "$HERE/make_wide_fixture.py" "$OUT" > /dev/null

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$HERE/convert.py" "$FIXTURE" "$work/bf16" --outtype bf16 --no-dump
bf16=("$work"/bf16/*.gguf)

rm -rf "${OUT:?}/$RUN" && mkdir -p "$OUT/$RUN"
cp "$work/bf16/convert.json" "$OUT/$RUN/convert.json"
# llama-quantize's log names the machine's paths: keep its own lines, paths replaced
"$quantize" "${bf16[0]}" "$OUT/$RUN/Glm4_Moe_Wide-Q4_K_M.gguf" Q4_K_M 1 2>&1 \
    | sed -e "s#$work#<work>#g" -e "s#$OUT#<out>#g" > "$OUT/$RUN/quantize.log"
"$LLAMACPP_VENV/bin/python" "$HERE/dump_gguf.py" "$OUT/$RUN/dump.json" "$OUT/$RUN"/*.gguf
echo "K-quant corpus: $OUT/$RUN ($(du -sh "$OUT/$RUN" | cut -f1))"
