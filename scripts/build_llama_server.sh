#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the server the `openai` rollout engine starts) from the llama.cpp that
# llama-cpp-python vendors, taken from its source archive on the package index, and prints the binary's path.
# Idempotent: a binary already built (and running) is reused.
#
#   JAXRL_LLM_LLAMA_SERVER=$(bash scripts/build_llama_server.sh) python -m pytest tests/sampling/test_llama_cpp_engine.py
#
# Only the server target and what it links are compiled, at low priority (the machine may be shared):
# CMAKE_BUILD_PARALLEL_LEVEL jobs (default 2). The cache folder is outside the repository:
# $JAXRL_LLM_LLAMA_CPP, default ~/.cache/jaxrl_llm/llama-server-<version>.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${JAXRL_LLM_LLAMA_CPP:-$HOME/.cache/jaxrl_llm/llama-server-$VERSION}
BIN="$CACHE/build/bin/llama-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi
SRC="$CACHE/src/llama_cpp_python-$VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  mkdir -p "$CACHE/src"
  pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/src" >&2
  tar xzf "$CACHE/src/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE/src"
fi
cmake -S "$SRC/vendor/llama.cpp" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
nice -n 19 cmake --build "$CACHE/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >&2
"$BIN" --version >&2
echo "$BIN"
