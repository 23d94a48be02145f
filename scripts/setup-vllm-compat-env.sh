#!/usr/bin/env bash
# Build the environment that runs tierkv's non-engine vLLM tests against vLLM 0.33's Python code on CPU.
#
# vLLM 0.33 is published only as the CUDA build; installed with its dependencies it is ~9.5 GB (torch for
# CUDA 13, flashinfer, cutlass ...) and still cannot run an engine on CPU. The tests this environment runs
# (vLLM's real Scheduler without a model, its tiering offload manager, the connector's own halves) need
# vLLM's Python code and its ordinary dependencies only. So this environment holds just the vllm 0.33.0
# wheel, installed without dependencies (~340 MB download, ~840 MB on disk; its compiled kernels are never
# loaded), and takes every dependency from the CPU environment of the vLLM tier (scripts/setup-vllm-env.sh:
# vllm-cpu 0.32.0, torch for CPU, transformers within 0.33's range) through a .pth file placed after its
# own site-packages: vLLM resolves to 0.33, everything else to the CPU tier's packages.
#
# Engine tests (a real model) need a CPU build of vLLM 0.33 (vllm-cpu 0.33.0 is not published) and are
# not run here.
#
# Idempotent. Usage: scripts/setup-vllm-compat-env.sh [VENV_DIR] [BASE_VENV]
#   (default: <repo>/.venv-vllm033 over <repo>/.venv-vllm; PYTHON=python3.11 to choose)
set -euo pipefail

VLLM_VERSION="0.33.0"

# shellcheck source=lib/engine-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-venv.sh"
engine_venv .venv-vllm033 "$@"
base="${2:-$repo/.venv-vllm}"
if [[ ! -x "$base/bin/python" ]]; then
    echo "error: $base is missing: build the vLLM tier first (scripts/setup-vllm-env.sh)" >&2
    exit 2
fi

if ! installed vllm "$VLLM_VERSION"; then
    "${pip[@]}" install --quiet --no-deps "vllm==$VLLM_VERSION"
fi
purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
echo "$(purelib "$base")" >"$(purelib "$venv")/zz-vllm-cpu-tier.pth"
# tierkv itself, editable: a .pth file's directory is not a site directory, so the CPU tier's editable
# install of tierkv is not seen from here, and the vault processes the tests start would not find it
if ! (cd / && "$venv/bin/python" -c 'import tierkv') >/dev/null 2>&1; then
    "${pip[@]}" install --quiet --no-deps -e "$repo"
fi

# from / so that the repository in the working directory cannot stand in for the installed tierkv
(cd / && "$venv/bin/python" - <<PY
import importlib.metadata as m
import vllm, torch, pytest, tierkv  # noqa: F401 - import check is the point
assert vllm.__version__.startswith("$VLLM_VERSION"), vllm.__version__
assert vllm.__file__.startswith("$venv"), vllm.__file__
print("vllm", vllm.__version__, "(Python code) | torch", torch.__version__, "| transformers", m.version("transformers"))
PY
)
