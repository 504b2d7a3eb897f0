#!/bin/bash
# Forty-ninth session: the causal order probe (and the op's non-kernel time), then the attention GPU tests.
export TRITON_CACHE_DIR=$PWD/out/tcache
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
if [ "${STAGE:-all}" != tests ]; then
  PYTHONPATH=src python benchmarks/order-s49/probe.py 2>&1 | grep -v -i warn | tee $OUT/probe.txt
fi
if [ "${STAGE:-all}" != bench ]; then
  PYTHONPATH=src timeout ${TEST_S:-300} python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE \
    ${TESTS:-tests/test_attention_kernels.py} 2>&1 | tail -15 | tee $OUT/tests.txt
fi
if [ "${STAGE:-all}" = ncu ] || [ "${NCU:-0}" = 1 ]; then
  PYTHONPATH=src python benchmarks/order-s49/ncu_one.py
  PYTHONPATH=src timeout 300 ncu --clock-control none -k regex:_gl -c 2 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
    python benchmarks/order-s49/ncu_one.py > $OUT/ncu_gl.txt 2>&1
  tail -3 $OUT/ncu_gl.txt
fi
