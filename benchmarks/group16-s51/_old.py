"""The tree before a change (``OLD_SRC``, e.g. ``git archive <commit> src | tar -x -C out/base_src`` and
OLD_SRC=out/base_src/src) imported as a second package, ``fp4attn_old``, for in-process A/B scripts."""
import importlib.util
import os
import sys


def old_package():
    root = os.path.join(os.environ["OLD_SRC"], "fp4attn")
    spec = importlib.util.spec_from_file_location("fp4attn_old", os.path.join(root, "__init__.py"),
                                                  submodule_search_locations=[root])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fp4attn_old"] = mod
    spec.loader.exec_module(mod)
    return mod
