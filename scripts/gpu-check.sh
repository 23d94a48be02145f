#!/usr/bin/env bash
# The checks that need a GPU, in one run, from the repository root:
#   1. the codec tests, whose device cases run on CUDA (skipped on machines without it);
#   2. benchmarks/torch_codec_device.py: encode / decode on the device against the bare host<->device copy;
#   3. `tierkv bench hf`: prefill vs hot hit vs cold restore TTFT of a random-weight transformers model on
#      the GPU, raw and int8, at 4k-32k tokens (it starts its own vaults on loopback: fast sync, 16 GiB,
#      as 32k tokens of Llama-3-8B are 4 GiB of KV).
# Each step's output goes to OUT (default: gpu-out); a failing step is reported and the next one still runs.
#
#   scripts/gpu-check.sh [OUT]
#
# PYTHON   the interpreter that has a CUDA build of torch (default: python3)
# WHEELS   a folder of wheels to install first without the network (for an offline GPU host: lmdb,
#          grpcio-health-checking and whatever else `pip check` says is missing), into a private folder
# SHAPE    model shape for the TTFT run (default: llama3-8b); TOKENS its prompt lengths (4k,8k,16k,32k);
#          MAX_SECONDS the most each codec's sweep may take (240; the run says where it stopped)
# DEVICE   cuda (default); cpu runs the same steps on the CPU, to try the script where there is no GPU
set -uo pipefail
PYTHON=${PYTHON:-python3}
OUT=${1:-gpu-out}
SHAPE=${SHAPE:-llama3-8b}
TOKENS=${TOKENS:-4k,8k,16k,32k}
DEVICE=${DEVICE:-cuda}
MAX_SECONDS=${MAX_SECONDS:-240}
mkdir -p "$OUT"

if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # tierkv and benchmarks from this checkout

failed=0
step() {  # step NAME COMMAND...: run, keep its output in OUT/NAME.txt, note a failure and go on
  local name=$1
  shift
  echo "== $name"
  if ! "$@" 2>&1 | tee "$OUT/$name.txt"; then
    echo "!! $name failed" | tee -a "$OUT/failed.txt"
    failed=1
  fi
}

step device "$PYTHON" -c "
import torch
if '$DEVICE' == 'cuda' and not torch.cuda.is_available():
    raise SystemExit('torch sees no CUDA device (torch ' + torch.__version__ + ')')
print(torch.__version__, torch.cuda.get_device_name(0) if '$DEVICE' == 'cuda' else 'cpu')"
[ $failed = 0 ] || exit 1  # no device: nothing below would measure what it says
step codec-tests "$PYTHON" -m pytest -q -p no:cacheprovider tests/codec/test_codec_torch.py \
  tests/codec/test_codec_torch_rows.py
step codec-device "$PYTHON" -m benchmarks.torch_codec_device --device "$DEVICE"
for codec in raw int8; do
  step "hf-$codec" "$PYTHON" -m tierkv bench hf --device "$DEVICE" --shape "$SHAPE" --tokens "$TOKENS" \
    --codec "$codec" --max-seconds "$MAX_SECONDS" --vault-max-bytes 16GiB --vault-sync fast \
    --json "$OUT/hf-$codec.json"
done
exit $failed
