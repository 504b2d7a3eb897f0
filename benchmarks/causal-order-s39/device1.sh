#!/usr/bin/env bash
# Thirty-ninth session, first device call: causal A/B (attention op, Attn-QAT, Thrift) against 041e216, the
# causal GPU tests, and an ncu profile of the Gluon decode kernel. Run from the repository root.
set -u
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src OLD_SRC=.ab_old/src
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$R/gpu.txt"
SHAPES="16,16,4096,128,1;4,16,16384,128,1;16,16,4096,64,1" \
RUNS="old-nvfp4:auto;nvfp4:auto;old-sage3:auto;sage3:auto;old-mxfp4:auto;mxfp4:auto" \
  timeout 200 python benchmarks/sage3-gluon-s38/ab.py > "$R/ab_causal.txt" 2>&1
timeout 150 python benchmarks/causal-order-s39/qat_ab.py > "$R/qat_ab.txt" 2>&1
timeout 100 ncu --clock-control none -k regex:_decode_split_kernel_gl -c 1 --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy \
  --section MemoryWorkloadAnalysis python benchmarks/f2fp-s29/ncu_one.py > "$R/ncu_decode.txt" 2>&1
timeout 120 python -m pytest -m gpu -q -x -n 14 -p no:cacheprovider -k causal tests/test_attention_kernels.py \
  tests/test_attn_qat_kernels.py tests/test_thrift_kernels.py > "$R/gpu_causal_tests.txt" 2>&1
tail -3 "$R"/*.txt
