#!/bin/bash
# Forty-ninth session: host-time parts on the final tree, then eager vs CUDA graphs at small shapes.
export TRITON_CACHE_DIR=$PWD/out/tcache
PYTHONPATH=src CALLS=100 RECIPES=nvfp4 python benchmarks/order-s49/host_parts.py 2>&1 | grep -v -i warn | tee $OUT/host_parts_final.txt
PYTHONPATH=src timeout 400 python benchmarks/order-s49/small_graphs.py 2>&1 | grep -v -i warn | tee $OUT/small_graphs.txt
