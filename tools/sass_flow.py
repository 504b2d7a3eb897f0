"""Compare the float arithmetic of two sm_90 SASS dumps of a straight-line quantizer kernel (the Quartet
QuEST kernel), as a proof that an edit elsewhere in the kernel left its statistics bit for bit alone.

Why: the QuEST statistics (mean, centred squares, variance, c * std + eps) are written as plain float
multiplies and adds, which Triton emits as PTX ``mul.f32`` / ``add.f32`` (no ``.rn``): ptxas is free to
contract each multiply into a neighbouring add (FFMA), and it picks per element (e.g. d = fma(sum,
-1/32, xh) for some elements, fma(y, c, -mean) for others; which product of a sum is fused). Those
choices change the rounding, and an unrelated edit of the kernel can flip them. So after every edit of
the kernel the float dataflow on the Hadamard output must be shown unchanged.

How: follows the fast path (forward branches taken: the sqrt slow-path call and the skipped atomic are
left out), names the HGMMA accumulator registers ``acc<chain>_<k>`` (and shared-memory loads, the operands of the
float32 FMA dot, by their address offset and occurrence), and builds a canonical expression
string for every float instruction (FFMA/FMUL/FADD/MUFU/FMNMX/FSEL and shuffles; operands of the
commutative products and sums sorted), keeping those built only from accumulators, shuffles and
constants. Two dumps agree when their sets of such expressions are equal, in particular the four
per-thread variances (the MUFU.RSQ inputs) and the NaN tests of the block_bad sums. Integer-derived
values (the scale 2**-e, codes, masks) are opaque here; their formulas are checked exhaustively by
tools/exactness_checks.py.

    PYTHONPATH=src python tools/sass_count.py quest --dump /tmp/old   # at the old commit
    PYTHONPATH=src python tools/sass_count.py quest --dump /tmp/new
    python tools/sass_flow.py /tmp/old/quest_nvfp4.sass /tmp/new/quest_nvfp4.sass [N] [--any-tile]

``--any-tile`` compares two tile shapes: the accumulator chains (one per 64-row HGMMA block) are not
told apart, so every thread row of the second dump must compute like one of the first (with one chain
pattern per row half, as ptxas emits them, that is the same arithmetic per group).
"""

import collections
import re
import sys

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_FP = {"FFMA", "FMUL", "FADD", "MUFU", "FMNMX", "FSEL"}
_COMM = {"FMUL", "FADD", "FMNMX", "FFMA"}  # FFMA: its two factors


def fast_path(path):
    """Instruction texts along the fast path: forward branches (predicated or not) are taken."""
    ins = []
    for line in open(path):
        m = _INS.search(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip().replace(".reuse", "")))
    idx = {a: i for i, (a, _) in enumerate(ins)}
    out, i = [], 0
    while i < len(ins):
        a, t = ins[i]
        body = re.sub(r"^@!?U?P[T0-9]+\s+", "", t)
        if body.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", body)
            tgt = int(m.group(1), 16) if m else -1
            if tgt > a and tgt in idx:
                i = idx[tgt]
                continue
            break  # the trailing self-loop
        out.append(t)
        i += 1
    return out


def flow(path):
    """(Counter of float-only expression strings, variances (MUFU inputs), NaN-tested values)."""
    reg, exprs, rsq, nan = {}, collections.Counter(), [], []
    seen = collections.Counter()
    chains = 0

    def val(tok):
        neg, tok = tok.startswith("-"), tok.lstrip("-")
        ab, tok = tok.startswith("|"), tok.strip("|")
        base = tok.split(".")[0]
        if base == "RZ":
            v = "0"
        elif base.startswith("R") and base[1:].isdigit():
            v = reg.get(base, f"?{base}")
        else:
            v = tok
        v = f"|{v}|" if ab else v
        return f"-{v}" if neg else v

    for text in fast_path(path):
        pred = None
        m = re.match(r"^(@!?U?P[T0-9]+)\s+(.*)$", text)
        if m:
            pred, text = m.group(1), m.group(2)
        parts = text.split(None, 1)
        op = parts[0]
        args = [a.strip() for a in parts[1].split(",")] if len(parts) > 1 else []
        base = op.split(".")[0]
        if base == "HGMMA":
            if "RZ" in args:  # a new accumulation chain (accumulator input RZ)
                chains += 1
                d = int(args[0][1:])
                for k in range(16):
                    reg[f"R{d + k}"] = f"acc{chains}_{k}"
            continue
        if base == "LDS" and args and args[0].startswith("R"):  # the float32 FMA dot reads shared memory
            off = re.sub(r"R\d+|UR\d+", "", args[1])
            seen[off] += 1
            width = {"128": 4, "64": 2}.get(op.split(".")[-1], 1)
            d = int(args[0][1:])
            for k in range(width):
                reg[f"R{d + k}"] = f"lds{off}#{seen[off]}_{k}"
            continue
        if base == "FSETP":
            if "NAN" in op:
                nan.append(val(args[2]))
            continue
        if base == "SHFL" and args and args[0] == "PT":
            args = args[1:]
        if not args or not args[0].startswith("R"):
            continue
        dst = args[0].split(".")[0]
        if base in _FP:
            srcs = [val(a) for a in args[1:]]
            if base in _COMM:
                srcs = sorted(srcs[:2]) + srcs[2:]
            e = f"{op}({','.join(srcs)})"
            if base == "MUFU":
                rsq.append(srcs[0])
        elif base == "SHFL":
            e = f"SHFL({val(args[1])},{args[2]})"
        elif op == "IMAD.MOV.U32" and args[1] == "RZ" and args[2] == "RZ" or base == "MOV":
            e = val(args[-1])
        else:
            e = f"int:{text}"
        if pred:
            e = f"phi({reg.get(dst, '?')},{e})"
        reg[dst] = e
        if "int:" not in e and "?" not in e:
            exprs[e] += 1
    return exprs, rsq, nan


def main(argv):
    any_tile = "--any-tile" in argv
    argv = [a for a in argv if a != "--any-tile"]
    a, ra, na = flow(argv[0])
    b, rb, nb = flow(argv[1])
    if any_tile:
        def norm(xs):
            return sorted({re.sub(r"acc\d+_", "acc_", x) for x in xs})
        a, ra, na, b, rb, nb = (norm(x) for x in (a, ra, na, b, rb, nb))
    fa = {e for e in a if "acc" in e or "lds" in e}
    fb = {e for e in b if "acc" in e or "lds" in e}
    same_var, same_nan = sorted(ra) == sorted(rb), sorted(na) == sorted(nb)
    print(f"variances (sqrt inputs) identical: {same_var} ({len(ra)} / {len(rb)})")
    print(f"NaN-tested sums identical: {same_nan} ({len(na)} / {len(nb)})")
    print(f"float expressions of the Hadamard output: {len(fa)} / {len(fb)}, only in the first {len(fa - fb)}, "
          f"only in the second {len(fb - fa)}")
    n = int(argv[2]) if len(argv) > 2 else 0
    for x in sorted(fa - fb, key=len)[:n]:
        print("  first: ", x[:400])
    for x in sorted(fb - fa, key=len)[:n]:
        print("  second:", x[:400])
    return 0 if same_var and same_nan and fa == fb else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
