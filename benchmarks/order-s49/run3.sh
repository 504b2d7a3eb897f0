#!/bin/bash
# Forty-ninth session, host-time changes: where the host time goes (new tree), small shapes on the base tree and on
# this one, then the launch / attention GPU tests.
export TRITON_CACHE_DIR=$PWD/out/tcache
PYTHONPATH=src CALLS=100 python benchmarks/order-s49/host_parts.py 2>&1 | grep -v -i warn | tee $OUT/host_parts_new.txt
PYTHONPATH=out/base_src/src python benchmarks/order-s49/small_shapes.py 2>&1 | grep -v -i warn | tee $OUT/small_base.txt
PYTHONPATH=src python benchmarks/order-s49/small_shapes.py 2>&1 | grep -v -i warn | tee $OUT/small_new.txt
PYTHONPATH=src timeout ${TEST_S:-300} python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE \
    ${TESTS:-tests/test_launch.py tests/test_attention_kernels.py tests/test_attention_prepass.py} 2>&1 | tail -8 | tee $OUT/tests.txt
