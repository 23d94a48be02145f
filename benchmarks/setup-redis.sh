#!/usr/bin/env bash
# Installs redis-server (Debian package) and redis-py with hiredis for benchmarks/vault_vs_redis.py.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null; fi
fi
py="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
"$py" -c 'import redis, hiredis' 2>/dev/null || "$py" -m pip install -q 'redis>=5' 'hiredis>=3'
redis-server --version
