#!/bin/bash
# fp16 K in the table kernel (old tree, then this one), the table's GPU tests and sage3's (forty-eighth session).
export TRITON_CACHE_DIR=$PWD/out/tcache
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
SH="16,16,4096,128,0;4,16,16384,128,0;16,16,4096,64,0"
DTYPE=fp16 SHAPES=$SH PYTHONPATH=out/base_src/src VARIANTS= python benchmarks/corr-s48/bench_table.py 2>&1 | grep -v -i warn | tee $OUT/table_fp16_base.txt
DTYPE=fp16 SHAPES=$SH PYTHONPATH=src VARIANTS= python benchmarks/corr-s48/bench_table.py 2>&1 | grep -v -i warn | tee $OUT/table_fp16_new.txt
SHAPES=$SH PYTHONPATH=src VARIANTS= python benchmarks/corr-s48/bench_table.py 2>&1 | grep -v -i warn | tee $OUT/table_bf16_new.txt
PYTHONPATH=src timeout 300 python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE tests/test_attention_prepass.py \
  tests/test_attention_kernels.py tests/test_ops.py -k "smooth or sage3 or prepass or nan or corr" 2>&1 | tail -3 | tee $OUT/tests.txt
