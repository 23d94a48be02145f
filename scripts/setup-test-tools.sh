#!/usr/bin/env bash
# System tools some vault tests use: strace (tests/vault/test_durability.py counts the vault's fsync calls).
#
# Idempotent and never fatal: a tool that is already there is left alone; without root or apt-get the
# script says what to install and exits 0, and the tests that need the tool skip with that reason.
# Usage: scripts/setup-test-tools.sh
set -euo pipefail

missing=()
for tool in strace; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
        echo "could not install ${missing[*]}; the tests that need them skip"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (sudo apt-get)"
    { sudo -n apt-get update -qq &&
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
        echo "could not install ${missing[*]}; the tests that need them skip"
else
    echo "not installed: ${missing[*]} (install them to run every vault test; the tests that need them skip)"
fi
