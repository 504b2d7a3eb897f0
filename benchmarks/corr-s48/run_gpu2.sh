#!/bin/bash
# GPU tests that read the smooth_q table, then the public ops against the old tree (forty-eighth session).
export TRITON_CACHE_DIR=$PWD/out/tcache
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
PYTHONPATH=src timeout ${TEST_S:-330} python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE \
  ${TESTS:-tests/test_attention_prepass.py tests/test_attention_kernels.py tests/test_ops.py tests/test_thrift_kernels.py tests/test_window.py tests/test_sinks.py} 2>&1 | tail -15 | tee $OUT/tests.txt
if [ "${AB:-1}" = 1 ]; then
  BASE=out/base_src/src ROUNDS=${ROUNDS:-3} PYTHONPATH=src python benchmarks/sage3-keyperm-s47/tree_ab.py 2>&1 | grep -v -i warn | tee $OUT/tree_ab.txt
fi
