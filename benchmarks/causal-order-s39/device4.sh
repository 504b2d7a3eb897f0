#!/usr/bin/env bash
# Thirty-ninth session, last call: the GPU suite on the final code, and STAGE_O at D = 64 with the order swapped
# (new first). Run from the repository root.
set -u
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src OLD_SRC=.ab_old/src
R=${OUT:-out}
mkdir -p "$R"
SHAPES="16,16,4096,64,0;16,16,4096,64,1;16,16,4096,128,1" RUNS="nvfp4:auto;old-nvfp4:auto" \
  timeout 150 python benchmarks/sage3-gluon-s38/ab.py > "$R/ab_stage_o_swapped.txt" 2>&1
grep -E "^##|nvfp4" "$R/ab_stage_o_swapped.txt"
timeout 430 python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE tests/ > "$R/gpu_suite.txt" 2>&1
tail -n 5 "$R/gpu_suite.txt"
