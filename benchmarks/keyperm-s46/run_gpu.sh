#!/bin/bash
# The A/B and the attention GPU tests on one machine (forty-sixth session).
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
python benchmarks/keyperm-s46/ab.py 2>&1 | grep -v -i warn | tee $OUT/ab.txt
timeout 300 python -m pytest -m gpu -n 8 -q -p no:cacheprovider -rfE ${TESTS:-tests/test_attention_kernels.py} 2>&1 | tail -15 | tee $OUT/tests.txt
