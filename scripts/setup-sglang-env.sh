#!/usr/bin/env bash
# Build the virtual environment that runs tierkv's SGLang and LMCache tier (tests marked `sglang` and
# `lmcache`) on a CPU-only machine, without CUDA wheels.
#
# `pip install sglang` pulls a CUDA torch, flashinfer and sglang-kernel (~11 GB). The tier needs only
# SGLang's cache classes (host pools, HiCache controller, storage factory, page hashes) and LMCache's
# connector classes, so both wheels are installed with --no-deps on a CPU torch, with the few packages
# their cache modules import, at the versions SGLang pins where it pins them:
# - triton: `sglang.srt.utils` imports it at the top (a CPU torch does not bring it);
# - torchvision: SGLang's model configs import it. The registry's build is linked against CUDA torch,
#   so its operator library does not load on a CPU torch; the tests declare the two operators it
#   registers at import (tests/connectors/sglang/cpu_torch.py). Nothing of it runs.
# - LMCache 0.5.6 asks for protobuf<7, which tierkv's generated code cannot use: its connector classes
#   import without it, so its dependencies are chosen here as for SGLang.
# tierkv is installed editable on top, constrained to that torch.
#
# Idempotent: re-running on a finished environment only re-checks it.
# Usage: scripts/setup-sglang-env.sh [VENV_DIR]   (default: <repo>/.venv-sglang; PYTHON=python3.11 to choose)
set -euo pipefail

SGLANG_VERSION="0.5.23"
LMCACHE_VERSION="0.5.6"
TORCH_VERSION="2.13.0"
TORCHVISION_VERSION="0.28.0"  # the release built for torch 2.13
TRITON_VERSION="3.8.0"
SGLANG_DEPS=(
    "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" "compressed-tensors==0.18.0"
    "apache-tvm-ffi==0.1.11" numpy orjson psutil pybase64 requests packaging pillow starlette msgspec
    pydantic pyzmq tqdm aiohttp ipython dill gguf
)
LMCACHE_DEPS=("numpy<=2.2.6" numba sortedcontainers cachetools prometheus-client py-cpuinfo aiofile cryptography)

# shellcheck source=lib/engine-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-venv.sh"
engine_venv .venv-sglang "$@"

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$TORCH_VERSION" >"$constraints"

if ! installed sglang "$SGLANG_VERSION" || ! installed lmcache "$LMCACHE_VERSION"; then
    "${pip[@]}" install --quiet "torch==$TORCH_VERSION"
    "${pip[@]}" install --quiet --no-deps "triton==$TRITON_VERSION" "torchvision==$TORCHVISION_VERSION" \
        "sglang==$SGLANG_VERSION" "lmcache==$LMCACHE_VERSION"
    "${pip[@]}" install --quiet -c "$constraints" "${SGLANG_DEPS[@]}" "${LMCACHE_DEPS[@]}"
fi
"${pip[@]}" install --quiet -c "$constraints" -e "$repo" "${PYTEST_REQS[@]}"

"$venv/bin/python" - <<PY
import importlib.metadata as m
import google.protobuf, torch, tierkv  # noqa: F401 - import check is the point
assert torch.__version__.startswith("$TORCH_VERSION") and not torch.cuda.is_available(), torch.__version__
assert not any(d.metadata["Name"].startswith("nvidia-") for d in m.distributions()), "a CUDA wheel came in"
print("sglang", m.version("sglang"), "| lmcache", m.version("lmcache"), "| torch", torch.__version__,
      "| protobuf", google.protobuf.__version__)
PY
