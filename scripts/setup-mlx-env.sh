#!/usr/bin/env bash
# Build the virtual environment that runs tierkv's MLX tier (tests marked `mlx`) on a CPU-only machine.
#
# MLX runs on Linux through its CPU backend (`mlx[cpu]` brings the `mlx-cpu` wheel). mlx-lm declares its
# `mlx` dependency for macOS only, so mlx is pinned here explicitly; mlx-lm brings transformers (for
# tokenizers) but not torch. tierkv is installed editable on top with its `mlx` extra.
#
# Idempotent: re-running on a finished environment only re-checks it.
# Usage: scripts/setup-mlx-env.sh [VENV_DIR]   (default: <repo>/.venv-mlx; PYTHON=python3.11 to choose)
set -euo pipefail

MLX_VERSION="0.32.4"
MLX_LM_VERSION="0.32.2"

# shellcheck source=lib/engine-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-venv.sh"
engine_venv .venv-mlx "$@"

if ! installed mlx "$MLX_VERSION" || ! installed mlx-lm "$MLX_LM_VERSION"; then
    "${pip[@]}" install "mlx[cpu]==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION"
fi
"${pip[@]}" install --quiet -e "$repo[mlx]" "${PYTEST_REQS[@]}"

"$venv/bin/python" - <<PY
import importlib.metadata as m
import mlx.core as mx, mlx_lm, tierkv  # noqa: F401 - import check is the point
assert m.version("mlx") == "$MLX_VERSION", m.version("mlx")
assert m.version("mlx-lm") == "$MLX_LM_VERSION", m.version("mlx-lm")
print("mlx", m.version("mlx"), "| mlx-lm", m.version("mlx-lm"), "| device", mx.default_device())
PY
