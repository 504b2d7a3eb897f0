"""Cross-tree A/B of the public ops (forty-seventh session): the tree in ``src`` against a base tree (``BASE``, e.g.
``git archive 3fa236a src | tar -x -C out/base_src``), each timed in its own subprocess, the trees alternating for
``ROUNDS`` rounds (min per tree). nvfp4 and sage3 at the issue-4 shapes, Thrift 5% at (4,16,16384,128) causal.
The inputs are the same in both trees (seeded); the script prints each tree's times and new/base ratios, and the
relative L2 between the trees' outputs.

    BASE=out/base_src/src ROUNDS=3 PYTHONPATH=src python benchmarks/sage3-keyperm-s47/tree_ab.py
"""
import json
import os
import subprocess
import sys

CHILD = r'''
import json, sys, torch, triton.testing, fp4attn
SH = [(16,16,4096,128,0),(16,16,4096,128,1),(4,16,16384,128,0),(16,16,4096,64,0),(16,16,4096,64,1),(4,16,16384,128,2)]
res, outs = {}, {}
for (B, H, N, D, m) in SH:
    g = torch.Generator(device="cuda").manual_seed(B * N + D + m)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    c = m > 0
    fns = {"thrift5": lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05)} if m == 2 else {
        r: (lambda r=r: fp4attn.attention(q, k, v, causal=c, recipe=r)) for r in ("nvfp4", "sage3")}
    for r, f in fns.items():
        key = f"{r} ({B},{H},{N},{D}){' causal' if c else ''}"
        o = f()
        outs[key] = o[:1, :2].float().cpu()
        res[key] = triton.testing.do_bench(f, warmup=10, rep=100)
torch.save(outs, sys.argv[1])
print(json.dumps(res))
'''

base = os.environ.get("BASE", "out/base_src/src")
rounds = int(os.environ.get("ROUNDS", "3"))
trees = {"new": "src", "base": base}
best = {}
os.makedirs("out", exist_ok=True)
for r in range(rounds):
    for name, path in (trees.items() if r % 2 == 0 else reversed(list(trees.items()))):
        env = {**os.environ, "PYTHONPATH": path}
        p = subprocess.run([sys.executable, "-c", CHILD, f"out/tree_ab_{name}.pt"], env=env, capture_output=True,
                           text=True)
        if p.returncode:
            print(p.stderr[-3000:])
            sys.exit(1)
        t = json.loads(p.stdout.strip().splitlines()[-1])
        for k, v in t.items():
            best.setdefault(name, {})[k] = min(v, best.get(name, {}).get(k, float("inf")))
        print(f"round {r} {name} done", flush=True)

import torch  # noqa: E402

from fp4attn.metrics import rel_l2  # noqa: E402

on, ob = torch.load("out/tree_ab_new.pt"), torch.load("out/tree_ab_base.pt")
print("| op | base ms | new ms | base/new | rel. L2 new vs base |")
print("|---|---:|---:|---:|---:|")
for k in best["new"]:
    b, n = best["base"][k], best["new"][k]
    rl = rel_l2(on[k], ob[k])
    print(f"| {k} | {b:.3f} | {n:.3f} | {b / n:.3f} | {rl:.2e} |")
