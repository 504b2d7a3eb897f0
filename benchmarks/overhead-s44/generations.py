"""Forty-fourth session: the per-program stamps of `times.py` (saved as results/programs_*.csv) grouped by the
order in which the programs reached their SM. The grid's blocks are dispatched round-robin over the 132 SMs in
launch order, so program p is the (p // 132)-th on its SM; four SM sub-partitions per SM make every four of those
one generation of warps (an SM sub-partition's first, second ... warp).

    python benchmarks/overhead-s44/generations.py
"""
import csv
import glob
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    for path in sorted(glob.glob(os.path.join(HERE, "results", "programs_*.csv"))):
        rows = list(csv.DictReader(open(path)))
        print(f"\n== {os.path.basename(path)}: {len(rows)} programs")
        print("slot (p // 132) | programs | mean end us | mean loop us | mean tiles")
        by_slot = {}
        for r in rows:
            by_slot.setdefault(int(r["program"]) // 132, []).append(r)
        for k in sorted(by_slot):
            rs = by_slot[k]
            end = statistics.mean(int(r["end_ns"]) for r in rs) / 1e3
            loop = statistics.mean(int(r["loop_end_ns"]) - int(r["loop_start_ns"]) for r in rs) / 1e3
            tiles = statistics.mean(int(r["tiles"]) for r in rs)
            print(f"{k} | {len(rs)} | {end:.1f} | {loop:.1f} | {tiles:.1f}")
        ends = [int(r["end_ns"]) / 1e3 for r in rows]
        print(f"end: min {min(ends):.1f}, median {statistics.median(ends):.1f}, max {max(ends):.1f} us")


if __name__ == "__main__":
    main()
