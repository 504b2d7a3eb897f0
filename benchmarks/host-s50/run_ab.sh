#!/bin/bash
# Fiftieth session: host time per eager call, base tree (out/base_src, `git archive <base> src`) and this tree
# alternately (ROUNDS rounds), then the outputs compared bit for bit.
export TRITON_CACHE_DIR=$PWD/out/tcache
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for r in $(seq ${ROUNDS:-2}); do
  TAG=base PYTHONPATH=out/base_src/src python benchmarks/host-s50/host_ab.py 2>&1 | grep -v -i warn | tee -a $OUT/host_ab.txt
  TAG=new PYTHONPATH=src python benchmarks/host-s50/host_ab.py 2>&1 | grep -v -i warn | tee -a $OUT/host_ab.txt
done
python - <<'PY' | tee -a $OUT/host_ab.txt
import os, torch
a = torch.load(os.path.join(os.environ["OUT"], "base_outputs.pt"))
b = torch.load(os.path.join(os.environ["OUT"], "new_outputs.pt"))
for n in a:
    print(f"{n:9s} bit-equal base/new: {all(torch.equal(x, y) for x, y in zip(a[n], b[n]))}")
PY
if [ "${PROFILE:-0}" = 1 ]; then
  TAG=new PROFILE=1 REPS=1 PYTHONPATH=src python benchmarks/host-s50/host_ab.py 2>&1 | grep -v -i warn > $OUT/profile_new.txt
fi
