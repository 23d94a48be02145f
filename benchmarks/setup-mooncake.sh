#!/usr/bin/env bash
# Builds .venv-mooncake with Mooncake Store (the non-CUDA wheel) for benchmarks/links.py, which measures it
# beside tierkv when this environment exists. Mooncake's transfer engine links libibverbs even for TCP, so
# the Debian package is installed too.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! ldconfig -p | grep -q 'libibverbs\.so\.1'; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libibverbs1 >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq libibverbs1 >/dev/null; fi
fi
venv="$root/.venv-mooncake"
[ -x "$venv/bin/python" ] || python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q 'mooncake-transfer-engine-non-cuda==0.3.13.post1' 'numpy>=1.26'
"$venv/bin/python" -c 'import mooncake.store' && echo "Mooncake Store ready: $venv"
