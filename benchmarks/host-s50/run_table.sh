#!/bin/bash
# Fiftieth session: the smooth_q table kernel, base tree (out/base_src) and this tree alternately, then the tables
# compared bit for bit; then GPU tests (TESTS).
export TRITON_CACHE_DIR=$PWD/out/tcache
for r in 1 2; do
  TAG=base PYTHONPATH=out/base_src/src python benchmarks/host-s50/table_ab.py 2>&1 | grep -v -i warn | tee -a $OUT/table_ab.txt
  TAG=new PYTHONPATH=src python benchmarks/host-s50/table_ab.py 2>&1 | grep -v -i warn | tee -a $OUT/table_ab.txt
done
python - <<'PY' | tee -a $OUT/table_ab.txt
import glob, os, torch
for f in sorted(glob.glob(os.path.join(os.environ["OUT"], "new_table_*.pt"))):
    a, b = torch.load(f.replace("new_", "base_")), torch.load(f)
    print(os.path.basename(f), "bit-equal base/new:", torch.equal(a, b))
PY
rm -f $OUT/*_table_*.pt
if [ -n "$TESTS" ]; then
  PYTHONPATH=src timeout ${TEST_S:-400} python -m pytest -m gpu -n 14 -q -p no:cacheprovider -rfE $TESTS 2>&1 | tail -8 | tee $OUT/tests.txt
fi
