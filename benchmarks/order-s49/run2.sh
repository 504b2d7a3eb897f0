#!/bin/bash
# Forty-ninth session, second device call: host time per call of the ops (+ cProfile), then 128-row Gluon programs.
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src
python benchmarks/order-s49/host_profile.py 2>&1 | grep -v -i warn > $OUT/host_profile.txt
head -8 $OUT/host_profile.txt
timeout 420 python benchmarks/order-s49/cfg_probe.py 2>&1 | grep -v -i warn | tee $OUT/cfg_probe.txt
