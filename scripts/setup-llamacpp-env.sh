#!/usr/bin/env bash
# Build the virtual environment that runs tierkv's llama.cpp tier (tests marked `llamacpp`).
#
# llama-cpp-python ships as a source package: pip compiles llama.cpp (~20 min on two busy cores, the
# first time) and keeps the built wheel in its cache, so a rerun on the same machine installs in seconds.
# The build is portable (GGML_NATIVE=OFF: the cached wheel also runs on an older CPU of the same
# architecture) and leaves out what the Python package never loads: llama.cpp's tests, examples, tools,
# HTTP server and the multimodal library (llama-cpp-python imports it only for vision chat handlers).
# pip's wheel cache is keyed by the source URL, not by CMAKE_ARGS: to rebuild with other flags, pass
# --no-cache-dir through PIP_NO_CACHE_DIR=1.
#
# Idempotent: re-running on a finished environment only re-checks it.
# Usage: scripts/setup-llamacpp-env.sh [VENV_DIR]   (default: <repo>/.venv-llamacpp; PYTHON=python3.11)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
GGUF_VERSION="0.19.0"

# shellcheck source=lib/engine-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-venv.sh"
engine_venv .venv-llamacpp "$@"

if ! installed llama_cpp_python "$LLAMA_CPP_PYTHON_VERSION"; then
    cmake_args=(
        -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
    )
    CMAKE_ARGS="${CMAKE_ARGS:-${cmake_args[*]}}" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
        "${pip[@]}" install "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
fi
"${pip[@]}" install --quiet -e "$repo[llamacpp]" "gguf==$GGUF_VERSION" "${PYTEST_REQS[@]}"

"$venv/bin/python" - <<PY
import importlib.metadata as m
import gguf, llama_cpp, llama_cpp.server.app, tierkv  # noqa: F401 - import check is the point
assert m.version("llama_cpp_python") == "$LLAMA_CPP_PYTHON_VERSION", m.version("llama_cpp_python")
print("llama-cpp-python", m.version("llama_cpp_python"), "| gguf", m.version("gguf"))
PY
