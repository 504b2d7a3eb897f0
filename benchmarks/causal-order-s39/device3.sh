#!/usr/bin/env bash
# Thirty-ninth session: the Gluon attention pass's output tile staged through shared memory (STAGE_O) against
# 041e216 (.ab_old), and the GPU tests of the Gluon attention pass and Thrift prefill. Run from the repository root.
set -u
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src OLD_SRC=.ab_old/src
R=${OUT:-out}
mkdir -p "$R"
SHAPES="16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,1;16,16,4096,64,0;16,16,4096,64,1" \
RUNS="old-nvfp4:auto;nvfp4:auto;old-sage3:auto;sage3:auto" \
  timeout 260 python benchmarks/sage3-gluon-s38/ab.py > "$R/ab_stage_o.txt" 2>&1
timeout 300 python -m pytest -m gpu -q -n 14 -p no:cacheprovider tests/test_attention_kernels.py \
  tests/test_thrift_kernels.py -k "gluon or thrift" > "$R/gpu_attn_tests.txt" 2>&1
grep -E "^##|nvfp4|sage3" "$R/ab_stage_o.txt"; tail -n 3 "$R/gpu_attn_tests.txt"
