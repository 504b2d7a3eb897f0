#!/usr/bin/env bash
# Thirty-ninth session, second A/B call: coalesced partial-output stores in the Gluon split kernel against 041e216
# (.ab_old), the decode table, the fixed-cost fit, and the decode GPU tests. Run from the repository root.
set -u
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src OLD_SRC=.ab_old/src
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/gpu.txt"
OUT=$R PYTHONPATH=src:benchmarks/f2fp-s29 timeout 200 python benchmarks/decode-fold-s32/ab.py > "$R/ab_stdout.txt" 2>&1
timeout 100 python benchmarks/decode-s39/fixed_probe.py > "$R/fixed_probe.txt" 2>&1
timeout 120 python -m fp4attn bench decode --rep-ms 100 --md "$R/bench_decode.md" > "$R/bench_decode.txt" 2>&1
timeout 150 python -m pytest -m gpu -q -n 14 -p no:cacheprovider tests/test_kvcache_decode.py \
  tests/test_thrift_decode_window.py tests/test_sinks.py tests/test_window.py > "$R/gpu_decode_tests.txt" 2>&1
tail -n 3 "$R/gpu_decode_tests.txt"
