#!/usr/bin/env bash
# Build llama.cpp's llama-server (and, unless LLAMACPP_SERVER_CLI=0, llama-cli) from the
# llama.cpp vendored in the PyPI sdist llama-cpp-python==0.3.36 (ggml-org/llama.cpp@0c1e57098),
# the same source install_venv.sh takes the GGUF converter from.  CPU only, Release, static.
#
#   [LLAMACPP_SERVER_BUILD=DIR] bash tests/thirdparty/llamacpp/server/build_server.sh
#   (default DIR: the repository's .llama-server, where the tests and .ci/run look)
#
# Result: $LLAMACPP_SERVER_BUILD/build/bin/llama-server (+ llama-cli), logs in
# $LLAMACPP_SERVER_BUILD/{cmake_config,build_server,build_cli}.log, times on stdout.
# Needs: python3 with pip (only for `pip download`), cmake >= 3.14, a C++17 compiler, ninja
# (else Unix Makefiles).  No network access beyond the package index: the server's web UI
# is not downloaded (LLAMA_USE_PREBUILT_UI=OFF, LLAMA_BUILD_UI=OFF -> no embedded UI), no
# libcurl, no OpenSSL.
# GGML_NATIVE=ON by default (fastest here; the binary then needs this CPU's ISA): set
# LLAMACPP_NATIVE=OFF for a portable build.  Measured from nothing on 2 cores shared with a
# vLLM test run: sdist download 66 s, configure 1 s, llama-server 1177 s (206 ninja steps:
# ggml, llama, common, mtmd, cpp-httplib, server), llama-cli 15 s more; binaries 15 MB each.
set -euo pipefail

BUILD="${LLAMACPP_SERVER_BUILD:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)/.llama-server}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
NATIVE="${LLAMACPP_NATIVE:-ON}"
WITH_CLI="${LLAMACPP_SERVER_CLI:-1}"
# LLAMACPP_FAST_BUILD=1: compile without optimisation (-O0), about twice as fast to build
# (9 min against 20 on 2 shared cores); the tests' tiny models run as fast either way
if [[ "${LLAMACPP_FAST_BUILD:-0}" == 1 ]]; then
    opt=(-DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS=-O0 -DCMAKE_CXX_FLAGS=-O0)
else
    opt=(-DCMAKE_BUILD_TYPE=Release)
fi

VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CPP_COMMIT=0c1e57098

t0=$(date +%s)
tree="$BUILD/tree"
if [[ ! -f "$tree/CMakeLists.txt" ]]; then
    rm -rf "$BUILD/dl" "$tree"
    mkdir -p "$BUILD/dl"
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$BUILD/dl" \
        "llama-cpp-python==$VERSION"
    tarball="$BUILD/dl/llama_cpp_python-$VERSION.tar.gz"
    echo "$SDIST_SHA256  $tarball" | sha256sum -c -
    tar -xzf "$tarball" -C "$BUILD/dl"
    grep -q "llama.cpp@$LLAMA_CPP_COMMIT" "$BUILD/dl/llama_cpp_python-$VERSION/CHANGELOG.md"
    mv "$BUILD/dl/llama_cpp_python-$VERSION/vendor/llama.cpp" "$tree"
    rm -rf "$BUILD/dl/llama_cpp_python-$VERSION"
fi
t1=$(date +%s)
echo "source: $tree ($((t1 - t0)) s)"

gen=()
if command -v ninja > /dev/null; then gen=(-G Ninja); fi
# The sdist has no usable .git (vendor/llama.cpp/.git is a gitlink to a missing
# ../../.git/modules/vendor/llama.cpp), so cmake/build-info.cmake would say commit "unknown",
# build 0; the commit is passed explicitly (shows in --version and /props build_info).
cmake -S "$tree" -B "$BUILD/build" "${gen[@]}" \
    "${opt[@]}" -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE="$NATIVE" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT" \
    > "$BUILD/cmake_config.log" 2>&1
t2=$(date +%s)
echo "configure: $((t2 - t1)) s"

cmake --build "$BUILD/build" -j "$JOBS" --target llama-server > "$BUILD/build_server.log" 2>&1
t3=$(date +%s)
echo "llama-server: $((t3 - t2)) s"

if [[ "$WITH_CLI" == 1 ]]; then
    cmake --build "$BUILD/build" -j "$JOBS" --target llama-cli > "$BUILD/build_cli.log" 2>&1
    t4=$(date +%s)
    echo "llama-cli: $((t4 - t3)) s (after llama-server)"
fi

"$BUILD/build/bin/llama-server" --version 2>&1 | head -3
echo "total: $(( $(date +%s) - t0 )) s"
