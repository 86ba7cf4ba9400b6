#!/usr/bin/env bash
# The GPU checks in one run (about 6 minutes on one GPU): the CUDA-only tests of hfai.nn and
# hfai.reduce, the Triton kernels compiled for real, the node health code on real NVML and the
# node validator on the GPUs with its results printed (tests/test_health_gpu.py), and
# bench/bench_nn.py's CPU and CUDA tables.
#
#   bash bench/gpu_check.sh [OUT_DIR]          # OUT_DIR defaults to $OUT, else /tmp/hfai-gpu-check
#
# Made for a borrowed machine with no network whose Python already has torch (CUDA), triton and
# pytest: hfai itself is put on PYTHONPATH without its dependencies (none of the GPU checks needs
# nats, isal or the CLI). The health checks also need msgpack and pynvml (nvidia-ml-py): where the
# machine's Python lacks them, make them beforehand on a machine with a network, in the ignored
# build/ folder, and carry that folder along (nvidia-ml-py is pure Python, and msgpack falls back
# to its pure-Python codec where its compiled one does not fit the machine's Python):
#
#   .venv/bin/python -m pip install --target build/gpu-deps msgpack nvidia-ml-py
#
# Every step runs even if an earlier one failed; the exit status is the first failure's.
# Without a GPU it still runs: the GPU tests then report themselves skipped.
set -u -o pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/hfai-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
status=0

step() {  # step NAME TIMEOUT_S CMD...: run CMD, keep its output in $out/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

if ! "$py" -c "import hfai.nn, hfai.reduce" 2>/dev/null; then
    # The import package `hfai` as pyproject.toml maps it (runtime/ plus the top-level folders),
    # built from symbolic links: no pip, no network, nothing written into the working tree.
    link=$(mktemp -d)
    mkdir "$link/hfai"
    ln -s "$PWD"/runtime/* "$link/hfai/"
    for d in protocol controller agent cli; do ln -s "$PWD/$d" "$link/hfai/$d"; done
    export PYTHONPATH="$link${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$py" -c "import msgpack, pynvml" 2>/dev/null && [ -d build/gpu-deps ]; then
    export PYTHONPATH="$PWD/build/gpu-deps${PYTHONPATH:+:$PYTHONPATH}"
fi
step env 60 "$py" -c "
import torch
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'device',
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ('triton', 'msgpack', 'pynvml'):
    try:
        m = __import__(name); print(name, getattr(m, '__version__', 'present'))
    except ImportError:
        print(name + ': not installed' + (' (the health checks skip: see the top of bench/gpu_check.sh)'
                                          if name != 'triton' else ''))
"
# -p no:cacheprovider: the working tree may be read-only or thrown away after the run.
step tests 240 "$py" -m pytest -q -p no:cacheprovider -rs \
    tests/test_nn_gpu.py tests/test_nn_triton.py tests/test_reduce_cuda.py
# -s: the validator's results and the NVML readings are printed, not captured.
step health 300 "$py" -m pytest -q -s -p no:cacheprovider -rs tests/test_health_gpu.py
step bench_nn 240 "$py" bench/bench_nn.py --repeats 15
exit "$status"
