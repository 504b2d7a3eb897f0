#!/bin/bash
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src:benchmarks/session6-2026-11-22/probes
for r in 1 2; do for v in base noscale nol noscale_nol; do
  VARIANT=$v python benchmarks/keyperm-s46/probe_alu.py 2>&1 | grep -v Warn | grep -v warn_once
done; done | tee $OUT/probe_alu.txt
