#!/usr/bin/env bash
# The first GPU run of the fused Q / V pre-passes, as one device call (run from the repository root; OUT: a folder
# for the logs, `$OUT` on the device machine). About 8 minutes on a fresh H200: the GPU tests of the attention
# passes (127 selected, compiled by 8 workers), then the probe (exactness, timing, per-kernel profile).
#   bash benchmarks/qfuse-s55/device_call.sh [rounds]
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/qfuse-s55/results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
(timeout 250 python -m pytest -m gpu -n 8 -q -p no:cacheprovider tests/test_attention_kernels.py \
    tests/test_attention_prepass.py tests/test_window.py tests/test_sinks.py \
    -k "gluon or prepass or window or sink or key_order or quantizes_q" 2>&1 | tail -25) | tee "$OUT/tests.txt"
timeout 240 python benchmarks/qfuse-s55/probe.py "${1:-3}" 2>&1 | tee "$OUT/probe.txt"
