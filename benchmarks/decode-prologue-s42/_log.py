"""The log of this folder's scripts: print and append to $OUT/<name>."""
import os


def logger(name: str):
    out = open(os.path.join(os.environ.get("OUT", "."), name), "a")

    def P(*a):
        print(*a, flush=True)
        print(*a, file=out, flush=True)
    return P
