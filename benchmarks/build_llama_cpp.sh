#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-completion, llama-server and llama-quantize from the
# llama.cpp vendored in the llama-cpp-python sdist (pinned), for side-by-side benchmarks and test
# files of every block type. Usage: build_llama_cpp.sh DEST
# DEST/bin gets the four programs; anyspec finds them there (or via $ANYSPEC_LLAMA_CPP).
# LLAMA_CMAKE_FLAGS replaces -DGGML_NATIVE=ON, e.g. an AVX2-only build on an AVX-512 machine:
#   LLAMA_CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# After the build, a two-token completion on a small GGUF (SMOKE_GGUF, else the built-in
# smollm2-135m, fetched through PY's anyspec) checks that the programs run on this CPU. A native
# build that fails it (a crash in the AMX kernels of some Xeons: SIGILL or SIGSEGV) is rebuilt once,
# in the same build tree, with GGML_NATIVE=OFF and the AVX/AVX2/AVX-512/VNNI flags this CPU reports,
# without AMX; its log is kept as smoke-native.log. Compiler output goes to DEST/cmake.log.
set -euo pipefail
VERSION=0.3.36
PROGRAMS="llama-bench llama-completion llama-server llama-quantize"
DEST=${1:?usage: build_llama_cpp.sh DEST}
PY=${PY:-python3}
# absolute paths: the script changes directory before it uses them
if [[ $PY == */* ]]; then PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"; fi
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
cd "$DEST"

smoke_model() {
  if [ -n "${SMOKE_GGUF:-}" ]; then echo "$SMOKE_GGUF"; return; fi
  "$PY" -c 'from anyspec.models import gguf_path; print(gguf_path("smollm2-135m"))' | tail -n 1
}

# A two-token completion of a several-token prompt (a batch of more than one row) on this CPU.
smoke_test() {
  local model
  model="$(smoke_model)" || { echo "smoke test: no GGUF to run (set SMOKE_GGUF)"; return 1; }
  # in a group whose stderr is dropped: a crash is reported by the caller in one line, not by bash
  { timeout 300 "$DEST/bin/llama-completion" -m "$model" -p "The capital of France is" -n 2 -no-cnv \
    --temp 0 -c 256 -t "$(nproc)" --no-warmup < /dev/null > "$DEST/smoke.log" 2>&1; } 2> /dev/null
}

# GGML_NATIVE=OFF with the x86 extensions /proc/cpuinfo lists, AMX left out.
portable_flags() {
  local have flags="-DGGML_NATIVE=OFF" f opt
  have=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  for f in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
           avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    opt=${f#*:}
    if [[ $have == *" ${f%%:*} "* ]]; then flags+=" -DGGML_$opt=ON"; else flags+=" -DGGML_$opt=OFF"; fi
  done
  echo "$flags"
}

unpack() {  # a clean source tree of the pinned version
  rm -rf src && mkdir src
  tar -xzf llama_cpp_python-$VERSION.tar.gz -C src --strip-components=1
}

build() {  # build FLAGS...: configure, compile and copy the programs into DEST/bin
  (
    cd src/vendor/llama.cpp
    cmake -B build "$@" -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >> "$DEST/cmake.log" 2>&1
    cmake --build build -j "$(nproc)" --target $PROGRAMS >> "$DEST/cmake.log" 2>&1
    rm -rf "$DEST/bin" && mkdir -p "$DEST/bin"
    for p in $PROGRAMS; do cp "build/bin/$p" "$DEST/bin/"; done
    # shared libraries, when the build made any
    find build -name '*.so*' -exec cp -P {} "$DEST/bin/" \; 2>/dev/null || true
  )
}

# An earlier build without llama-quantize: add it from the kept build tree.
if [ -x bin/llama-server ] && [ ! -x bin/llama-quantize ] && [ -d src/vendor/llama.cpp/build ]; then
  (
    cd src/vendor/llama.cpp
    cmake --build build -j "$(nproc)" --target llama-quantize >> "$DEST/cmake.log" 2>&1
    cp build/bin/llama-quantize "$DEST/bin/"
    find build -name '*.so*' -exec cp -P {} "$DEST/bin/" \; 2>/dev/null || true
  ) && echo "added llama-quantize to $DEST/bin"
fi
if [ -x bin/llama-server ] && [ -x bin/llama-bench ] && [ -x bin/llama-completion ] && [ -x bin/llama-quantize ]; then
  if smoke_test; then echo "llama.cpp already built in $DEST/bin (smoke test passed)"; exit 0; fi
  echo "llama.cpp in $DEST/bin fails its smoke test (see $DEST/smoke.log); rebuilding"
fi
if [ ! -f llama_cpp_python-$VERSION.tar.gz ]; then
  "$PY" -m pip download --no-deps --no-binary :all: -d . "llama-cpp-python==$VERSION"
fi
echo "building llama.cpp $VERSION in $DEST (compiler output: $DEST/cmake.log)"
: > "$DEST/cmake.log"
unpack
# shellcheck disable=SC2086  # the flags are words
build ${LLAMA_CMAKE_FLAGS:--DGGML_NATIVE=ON}
if ! smoke_test; then
  if [ -n "${LLAMA_CMAKE_FLAGS:-}" ]; then
    echo "llama.cpp built with LLAMA_CMAKE_FLAGS fails its smoke test; see $DEST/smoke.log" >&2; exit 1
  fi
  flags="$(portable_flags)"
  cp "$DEST/smoke.log" "$DEST/smoke-native.log"
  echo "the native llama.cpp build fails its smoke test (see $DEST/smoke-native.log); rebuilding without AMX: $flags"
  # shellcheck disable=SC2086
  build $flags
  smoke_test || { echo "llama.cpp fails its smoke test; see $DEST/smoke.log" >&2; exit 1; }
fi
echo "llama.cpp built: $DEST/bin (smoke test passed)"
