# Shared by the engine-tier setup scripts (sourced, not run): the virtual environment each tier builds.
#
# engine_venv DEFAULT_DIR [VENV_DIR]: sets `repo`, `venv` (VENV_DIR or <repo>/DEFAULT_DIR), `pip` (an array
# running that venv's pip) and the `installed NAME VERSION` test; creates the venv on first use.
# PYTHON chooses the interpreter (default python3.11, else python3). PYTEST_REQS: what every tier's tests
# need on top of the engine.

PYTEST_REQS=("pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100")

engine_venv() {
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    venv="${2:-$repo/$1}"
    local python="${PYTHON:-python3.11}"
    command -v "$python" >/dev/null 2>&1 || python="python3"
    if [[ ! -x "$venv/bin/python" ]]; then
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
    fi
    pip=("$venv/bin/python" -m pip)
}

installed() {
    "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}
