#!/bin/bash
# The attention / Thrift GPU tests, then the A/B (forty-seventh session). STAGE=tests / ab runs one part only.
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
if [ "${STAGE:-all}" != ab ]; then
  timeout ${TEST_S:-300} python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE \
    ${TESTS:-tests/test_attention_kernels.py tests/test_thrift_kernels.py tests/test_aot_compile.py} 2>&1 \
    | tail -15 | tee $OUT/tests.txt
fi
if [ "${STAGE:-all}" != tests ]; then
  python benchmarks/sage3-keyperm-s47/ab.py 2>&1 | grep -v -i warn | tee $OUT/ab.txt
fi
