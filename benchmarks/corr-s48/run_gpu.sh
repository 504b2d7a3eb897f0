#!/bin/bash
# The table kernel's timings (old tree, then this one), then the GPU tests that read the table (forty-eighth session).
export TRITON_CACHE_DIR=$PWD/out/tcache
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
if [ "${STAGE:-all}" != tests ]; then
  PYTHONPATH=out/base_src/src VARIANTS= python benchmarks/corr-s48/bench_table.py 2>&1 | grep -v -i warn | tee $OUT/table_base.txt
  PYTHONPATH=src python benchmarks/corr-s48/bench_table.py 2>&1 | grep -v -i warn | tee $OUT/table_new.txt
fi
if [ "${STAGE:-all}" != bench ]; then
  PYTHONPATH=src timeout ${TEST_S:-300} python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE \
    ${TESTS:-tests/test_attention_prepass.py tests/test_attention_kernels.py} 2>&1 | tail -15 | tee $OUT/tests.txt
fi
