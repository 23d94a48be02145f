#!/usr/bin/env bash
# Regenerate tierkv/wire/_proto from proto/ (python + typing stubs). Output dir defaults to the package.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$here/tierkv/wire/_proto}"
py="${PYTHON:-$here/.venv/bin/python}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
PATH="$(dirname "$py"):$PATH" "$py" -m grpc_tools.protoc -I "$here/proto" --python_out="$tmp" --mypy_out="$tmp" "$here/proto/tierkv/v1/vault.proto"
mkdir -p "$out"
cp "$tmp/tierkv/v1/vault_pb2.py" "$out/vault_pb2.py"
cp "$tmp/tierkv/v1/vault_pb2.pyi" "$out/vault_pb2.pyi"
[ -f "$out/__init__.py" ] || printf '"""Code generated from proto/ by scripts/gen-proto.sh; do not edit."""\n' > "$out/__init__.py"
