#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-completion and llama-server from the llama.cpp vendored in
# the llama-cpp-python sdist (pinned), for side-by-side benchmarks. Usage: build_llama_cpp.sh DEST
# DEST/bin gets the three programs; anyspec finds them there (or via $ANYSPEC_LLAMA_CPP).
# LLAMA_CMAKE_FLAGS replaces -DGGML_NATIVE=ON, e.g. an AVX2-only build on an AVX-512 machine:
#   LLAMA_CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
set -euo pipefail
VERSION=0.3.36
DEST=${1:?usage: build_llama_cpp.sh DEST}
PY=${PY:-python3}
mkdir -p "$DEST"
cd "$DEST"
if [ -x bin/llama-server ] && [ -x bin/llama-bench ] && [ -x bin/llama-completion ]; then
  echo "llama.cpp already built in $DEST/bin"; exit 0
fi
if [ ! -f llama_cpp_python-$VERSION.tar.gz ]; then
  "$PY" -m pip download --no-deps --no-binary :all: -d . "llama-cpp-python==$VERSION"
fi
rm -rf src && mkdir src
tar -xzf llama_cpp_python-$VERSION.tar.gz -C src --strip-components=1
cd src/vendor/llama.cpp
# shellcheck disable=SC2086  # the flags are words
cmake -B build ${LLAMA_CMAKE_FLAGS:--DGGML_NATIVE=ON} -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > "$DEST/cmake.log"
cmake --build build -j "$(nproc)" --target llama-bench llama-completion llama-server >> "$DEST/cmake.log"
mkdir -p "$DEST/bin"
cp build/bin/llama-bench build/bin/llama-completion build/bin/llama-server "$DEST/bin/"
# shared libraries, when the build made any
find build -name '*.so*' -exec cp -P {} "$DEST/bin/" \; 2>/dev/null || true
echo "llama.cpp built: $DEST/bin"
