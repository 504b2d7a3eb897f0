#!/bin/bash
# Where the pre-pass stands (H100): per-kernel times of the op, copy bandwidth, ncu of the three pre-pass kernels.
export TRITON_CACHE_DIR=$PWD/out/tcache PYTHONPATH=src
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
RECIPES=nvfp4,sage3 python benchmarks/keyperm-s46/../prepass-s34/kernel_times.py > $OUT/kernel_times.txt 2>&1
python benchmarks/keyperm-s46/ncu_prep.py  # warm the cache
ncu --clock-control none -k regex:_prep -c 3 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_elapsed.avg \
    python benchmarks/keyperm-s46/ncu_prep.py > $OUT/ncu_prep.txt 2>&1
tail -5 $OUT/ncu_prep.txt
