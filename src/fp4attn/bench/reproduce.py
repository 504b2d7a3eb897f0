"""``fp4attn bench reproduce``: the papers' claims, reproduced on two small models (see RESULTS.md).

Two models, each pre-trained from scratch with BF16 attention (PyTorch SDPA), then studied with the
public ops of fp4attn (every layer, every head):

* **LM** — the character-level Llama of ``fp4attn bench quartet_train`` (RMSNorm, RoPE, SwiGLU, BF16
  linears) on the text given with ``--data`` (e.g. tinyshakespeare; never bundled; without ``--data``
  this model is skipped). Metric: held-out cross-entropy (nats per character) on fixed validation
  windows of each context length.
* **synthetic** — the task and model of ``fp4attn demo`` (multi-query associative recall in a haystack,
  one K outlier channel per head), at the demo's default size. Metric: retrieval accuracy and loss on
  the queried values, at each context length.

Parts (``--parts``, default all):

* **(a)** FP4 post-training quantization (``attention`` with ``nvfp4`` / ``mxfp4`` / ``sage3``) of the
  BF16-trained weights, then an Attn-QAT fine-tune (``attn_qat``, NVFP4) evaluated with FP4 inference,
  next to a BF16 fine-tune of the same length from the same weights on the same batches (the control:
  "more training" is not recovery). Attn-QAT Tables 1-4 analogue.
* **(b)** Attn-QAT ablations (Attn-QAT Table 2 / Fig. 3): the same fine-tune with ``high_precision_o=False``
  (D from the FP4 output O instead of O'), ``quantize_p_in_backward=False`` (dV from unquantized P) and
  ``backward="naive"`` (FP4 forward, BF16 FlashAttention backward); per-step gradient norms (before
  clipping) and losses, final losses, FP4 evaluation.
* **(c)** ThriftAttention: ``thrift_attention`` at several budgets on the BF16-trained weights; share
  of the nvfp4-PTQ → BF16 gap recovered, per context length.
* **(d)** SageAttention3's orderings (NVFP4 vs MXFP4, two-level vs direct P, Q/K smoothing on vs off,
  all of SageAttention3 vs plain NVFP4) on real Q, K, V captured with forward hooks from the
  BF16-trained models, each recipe against exact float64 attention (CosSim, relative L1, RMSE).

Output (``--out``): ``reproduce.md`` (tables; a header line with device, date, settings, command),
``reproduce_{a,b,c,d}.csv``, ``reproduce_d_claims.csv``, ``reproduce_curves.csv`` (every training step),
``reproduce.json``, and the PNGs ``reproduce_a_loss.png``, ``reproduce_b_grad_norm.png``,
``reproduce_c_thrift.png``, ``reproduce_d_orderings.png`` (with matplotlib).

Every run is seeded (model init, batch order, evaluation windows); all fine-tunes of a model start
from the same weights and see the same batches. On CUDA, Attn-QAT kernel autotuning is switched off
(``FP4ATTN_AUTOTUNE=0``: fixed tiles, so no timing-dependent choice; ``--autotune`` keeps it) and the
Triton kernels are first compiled in parallel processes (``--warm-jobs``). ``--minutes`` skips every
phase that would start after that much wall time (reported in ``reproduce.md``); ``--scale`` and the
per-model step options trim the training. ``--tiny`` is a seconds-long CPU smoke setting.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
import types
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .. import demo
from ..envinfo import device_arg
from . import quartet_train as qt
from .common import device_name, now_utc, write_csv

PARTS = ("a", "b", "c", "d")
MODELS = ("lm", "synthetic")
# (run name, attn_qat switches); the first one is Attn-QAT itself (also the Attn-QAT run of part a)
ABLATIONS = (
    ("Attn-QAT", {}),
    ("no O' (D from O)", {"high_precision_o": False}),
    ("no P re-quant in bwd", {"quantize_p_in_backward": False}),
    ("naive FA backward", {"backward": "naive"}),
)
CONTROL = "BF16 control"
BASE = "BF16-trained"
THRIFT_BUDGETS = (0.05, 0.10, 0.25, 0.50)
D_RECIPES = ("nvfp4", "mxfp4", "nvfp4+two-level P", "nvfp4+smoothing", "sage3")


def _claims():
    from ..accuracy import ORDERINGS
    return tuple((text, good, bad) for _, text, good, bad in ORDERINGS) + (
        ("Q/K smoothing better than none (SageAttention3 §3.1)", "nvfp4+smoothing", "nvfp4"),
        ("sage3 (smoothing + two-level P) better than plain NVFP4", "sage3", "nvfp4"),
    )


# ------------------------------------------------------------------------------------------------
# settings
# ------------------------------------------------------------------------------------------------
@dataclass
class LMConfig:
    d_model: int = 256
    layers: int = 4
    heads: int = 4                 # head dim 64
    ffn: int = 704
    seq: int = 2048                # training context (== the longest evaluation context)
    batch: int = 8
    lr: float = 1e-3
    pretrain_steps: int = 1500
    ft_steps: int = 300            # every fine-tune (Attn-QAT, control, each ablation)
    ft_lr: float = 3e-4
    contexts: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    eval_tokens: int = 65536       # validation tokens per context length (fixed windows)
    eval_batch_tokens: int = 16384
    thrift_block: int = 64         # the paper's block size, and the one the Triton Thrift kernel runs
    capture_batch: int = 2         # windows of the longest context whose Q, K, V part (d) uses


LM_TINY = dict(d_model=32, layers=2, heads=2, ffn=64, seq=64, batch=4, pretrain_steps=20, ft_steps=3,
               contexts=[32, 64], eval_tokens=128, eval_batch_tokens=128, thrift_block=16, capture_batch=2)
SYN_CAPTURE_BATCH = {"tiny": 2, "default": 8}


# ------------------------------------------------------------------------------------------------
# the two models, behind one small interface
# ------------------------------------------------------------------------------------------------
class _LMTask:
    """The char-level Llama of :mod:`fp4attn.bench.quartet_train` on a text file."""
    name = "LM"
    has_acc = False

    def __init__(self, cfg: LMConfig, path: str, device, seed: int):
        self.cfg, self.device, self.seed = cfg, device, seed
        self.train_ids, self.val_ids, self.vocab = qt.load_chars(path, device)
        self.contexts = list(cfg.contexts)
        if self.val_ids.numel() < max(self.contexts) + 2:
            raise ValueError(f"--data: the validation split ({self.val_ids.numel()} chars) is shorter than the "
                             f"longest context {max(self.contexts)}")
        self.pretrain_steps, self.ft_steps = cfg.pretrain_steps, cfg.ft_steps
        self.thrift_block = cfg.thrift_block

    def describe(self) -> str:
        c = self.cfg
        return (f"LM: char-level Llama, {c.layers} layers, d={c.d_model}, {c.heads} heads (D={c.d_model // c.heads}), "
                f"ffn {c.ffn}, vocab {self.vocab}; pre-training {self.pretrain_steps} steps of {c.batch}x{c.seq} "
                f"(lr {c.lr}), fine-tunes {self.ft_steps} steps (lr {c.ft_lr}); eval contexts {self.contexts}, "
                f"{c.eval_tokens} tokens each; Thrift block {c.thrift_block}")

    def head_shape(self) -> tuple[int, int]:
        return self.cfg.heads, self.cfg.d_model // self.cfg.heads

    def new_model(self):
        torch.manual_seed(self.seed)
        c = self.cfg
        return qt.TinyLlama(self.vocab, c.d_model, c.layers, c.heads, c.ffn).to(self.device)

    def _train(self, model, attn, steps, lr, seed, grad_norms):
        model.set_attention(attn)
        try:
            return qt.train_loop(model, self.train_ids, self.vocab, self.device, steps=steps, batch_size=self.cfg.batch,
                                 seq=self.cfg.seq, lr=lr, seed=seed, name="LM", log=_log, grad_norms=grad_norms)
        finally:
            model.set_attention(None)

    def pretrain(self, model, grad_norms):
        return self._train(model, None, self.pretrain_steps, self.cfg.lr, self.seed, grad_norms)

    def finetune(self, model, setting, grad_norms):
        attn = None if setting is None else demo.make_attn(setting)
        return self._train(model, attn, self.ft_steps, self.cfg.ft_lr, self.seed + 1000, grad_norms)

    def evaluate(self, model, setting) -> dict:
        c = self.cfg
        model.set_attention(demo.make_attn(setting))
        out = {}
        try:
            for ctx in self.contexts:
                bs = max(1, c.eval_batch_tokens // ctx)
                nb = max(1, c.eval_tokens // (bs * ctx))
                loss = qt.val_loss(model, self.val_ids, self.vocab, self.device, batch_size=bs, seq=ctx, batches=nb,
                                   seed=self.seed + 1234)
                out[ctx] = {"acc": float("nan"), "loss": loss}
        finally:
            model.set_attention(None)
        return out

    def capture_shape(self) -> tuple[int, int, int, int]:
        h, d = self.head_shape()
        return self.cfg.capture_batch, h, max(self.contexts), d

    @torch.no_grad()
    def capture(self, model) -> list[tuple]:
        """(q, k, v, scale) of every layer (after RoPE), from forward hooks on the attention modules."""
        model.eval()
        model.set_attention(None)
        x, _ = qt.batch(self.val_ids, self.cfg.capture_batch, max(self.contexts),
                        torch.Generator().manual_seed(self.seed + 4321))
        got: dict[int, tuple] = {}
        hooks = [blk.attn.register_forward_hook(
            lambda mod, args, out, i=i: got.__setitem__(i, tuple(a.detach().contiguous() for a in args[:3])))
            for i, blk in enumerate(model.layers)]
        try:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                model(x)
        finally:
            for h in hooks:
                h.remove()
        return [(*got[i], None) for i in range(len(model.layers))]

    def thrift_blocks(self, ctx: int) -> int:
        return -(-ctx // self.thrift_block)


class _Tap(nn.Module):
    """Wraps the demo model's attention function in a module, so that a forward hook can see its inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q, k, v, scale=None):
        return self.fn(q, k, v, scale)


class _SyntheticTask:
    """The task and model of :mod:`fp4attn.demo` (same settings, seeds and evaluation sequences)."""
    name = "synthetic"
    has_acc = True

    def __init__(self, s: demo.Settings, device, capture_batch: int):
        self.s, self.device, self.capture_batch = s, device, capture_batch
        self.vocab = demo.Vocab(s)
        eval_gen = torch.Generator().manual_seed(s.seed + 12345)   # as fp4attn demo
        self.data = {c: demo.make_batch(s, self.vocab, s.eval_seqs, c, eval_gen) for c in s.contexts}
        self.contexts = list(s.contexts)
        self.autocast = device.type == "cuda"
        self.pretrain_steps, self.ft_steps = s.train_steps, s.qat_steps
        self.thrift_block = s.thrift_block

    def describe(self) -> str:
        s = self.s
        return (f"synthetic: fp4attn demo task and model, {s.n_layers} layers, d={s.d_model}, {s.n_heads} heads "
                f"(D={s.d_model // s.n_heads}), K outlier {s.k_outlier}, keys {s.n_keys}, {s.queries} queries; "
                f"pre-training {s.train_steps} steps at contexts {s.train_contexts} (lr {s.lr}), fine-tunes "
                f"{s.qat_steps} steps at {s.qat_contexts} (lr {s.qat_lr}); eval contexts {s.contexts}, "
                f"{s.eval_seqs} sequences each; Thrift block {s.thrift_block}")

    def head_shape(self) -> tuple[int, int]:
        return self.s.n_heads, self.s.d_model // self.s.n_heads

    def new_model(self):
        torch.manual_seed(self.s.seed)
        return demo.TinyLM(self.vocab.size, self.s).to(self.device)

    def pretrain(self, model, grad_norms):
        s = self.s
        return demo.train(model, s, self.vocab, steps=s.train_steps, lr=s.lr, contexts=s.train_contexts,
                          tokens_per_batch=s.train_tokens, attn=demo.sdpa_attn,
                          gen=torch.Generator().manual_seed(s.seed), device=self.device, desc="",
                          autocast=self.autocast, grad_norms=grad_norms, progress=False)

    def finetune(self, model, setting, grad_norms):
        s = self.s
        attn = demo.sdpa_attn if setting is None else demo.make_attn(setting)
        return demo.train(model, s, self.vocab, steps=s.qat_steps, lr=s.qat_lr, contexts=s.qat_contexts,
                          tokens_per_batch=s.qat_tokens, attn=attn, gen=torch.Generator().manual_seed(s.seed + 1),
                          device=self.device, desc="", autocast=self.autocast, grad_norms=grad_norms, progress=False)

    def evaluate(self, model, setting) -> dict:
        res = demo.evaluate(model, self.s, self.data, demo.make_attn(setting), self.device)
        return {c: {"acc": a, "loss": l} for c, (a, l) in res.items()}

    def capture_shape(self) -> tuple[int, int, int, int]:
        h, d = self.head_shape()
        return min(self.capture_batch, self.s.eval_seqs), h, max(self.contexts), d

    @torch.no_grad()
    def capture(self, model) -> list[tuple]:
        """(q, k, v, scale) of every layer (after RoPE and the K outlier offset), all positions of the longest
        evaluation sequences, from a forward hook on the attention call (float32, as the demo evaluates)."""
        model.eval()
        tokens = self.data[max(self.contexts)][0][: self.capture_batch].to(self.device)
        tap = _Tap(demo.sdpa_attn)
        got: list[tuple] = []
        h = tap.register_forward_hook(lambda mod, args, out: got.append(
            tuple(a.detach().contiguous() for a in args[:3]) + (args[3] if len(args) > 3 else None,)))
        try:
            model(tokens, tap)
        finally:
            h.remove()
        return got

    def thrift_blocks(self, ctx: int) -> int:
        return -(-ctx // self.thrift_block)


# ------------------------------------------------------------------------------------------------
# running the parts
# ------------------------------------------------------------------------------------------------
_T0 = [time.time()]


def _log(msg: str) -> None:
    print(f"[reproduce {time.time() - _T0[0]:6.1f}s] {msg}", flush=True)


class _Clock:
    """``allow(phase)`` is False once ``minutes`` of wall time have passed (the phase is then recorded
    as skipped); a phase that has started always runs to its end."""

    def __init__(self, minutes: float | None):
        self.limit = None if not minutes or minutes <= 0 else 60.0 * minutes
        self.skipped: list[str] = []

    def allow(self, phase: str) -> bool:
        if self.limit is not None and time.time() - _T0[0] > self.limit:
            self.skipped.append(phase)
            _log(f"time guard ({self.limit / 60:.1f} min): skipping {phase}")
            return False
        return True


def _ptq_and_thrift_settings(task) -> tuple[list, list]:
    ns = types.SimpleNamespace(thrift_budgets=list(THRIFT_BUDGETS), thrift_block=task.thrift_block)
    rows = demo.eval_settings(ns)  # the demo's PTQ and Thrift settings, with this model's Thrift block
    return [r for r in rows if r[1]["op"] == "attention"], [r for r in rows if r[1]["op"] == "thrift"]


class _Runner:
    """All results of one model: training curves, evaluations, Thrift rows, part (d) rows."""

    def __init__(self, task, parts, clock: _Clock):
        self.task, self.parts, self.clock = task, parts, clock
        self.curves: dict[str, dict] = {}       # run -> {"loss": [...], "grad_norm": [...]}
        self.evals: dict[tuple, dict] = {}      # (weights, attention) -> {ctx: {"acc", "loss"}}
        self.states: dict[str, dict] = {}
        self.d_rows: list[dict] = []
        self.captured_shapes: list[tuple] = []
        self.seconds: dict[str, float] = {}
        self.ptq, self.thrift = _ptq_and_thrift_settings(task)
        self.model = None

    # -- helpers
    def _timed(self, key, fn):
        t = time.time()
        out = fn()
        self.seconds[key] = self.seconds.get(key, 0.0) + time.time() - t
        return out

    def _eval(self, weights: str, setting_name: str, setting: dict):
        key = (weights, setting_name)
        if key not in self.evals:
            model = self.model if weights == BASE else self._load(weights)
            self.evals[key] = self._timed("eval", lambda: self.task.evaluate(model, setting))
        return self.evals[key]

    def _load(self, run: str):
        m = self.task.new_model()
        m.load_state_dict(self.states[run])
        return m

    def _finetune(self, run: str, setting: dict | None) -> bool:
        if run in self.curves:
            return True
        if not self.clock.allow(f"{self.task.name} fine-tune '{run}'"):
            return False
        m = self.task.new_model()
        m.load_state_dict(self.states[BASE])
        gn: list[float] = []
        t = time.time()
        losses = self.task.finetune(m, setting, gn)
        dt = time.time() - t
        self.seconds[f"fine-tune {run}"] = dt
        self.curves[run] = {"loss": losses, "grad_norm": gn}
        self.states[run] = {k: v.detach().clone() for k, v in m.state_dict().items()}
        tail = losses[-max(1, len(losses) // 10):]
        _log(f"{self.task.name}: fine-tune '{run}' {len(losses)} steps in {dt:.1f} s "
             f"({len(losses) / max(dt, 1e-9):.1f} steps/s), final loss {sum(tail) / len(tail):.4f}, "
             f"grad norm median {_median(gn):.3g} max {max(gn) if gn else float('nan'):.3g}")
        self._eval(run, "nvfp4", dict(op="attention", recipe="nvfp4"))
        self._eval(run, "bf16", dict(op="attention", recipe="bf16"))
        return True

    # -- phases
    def pretrain(self) -> bool:
        if not self.clock.allow(f"{self.task.name} pre-training (and all its parts)"):
            return False
        self.model = self.task.new_model()
        gn: list[float] = []
        t = time.time()
        losses = self.task.pretrain(self.model, gn)
        dt = time.time() - t
        self.seconds["pre-training"] = dt
        self.curves["BF16 pre-training"] = {"loss": losses, "grad_norm": gn}
        self.states[BASE] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        tail = losses[-max(1, len(losses) // 10):]
        _log(f"{self.task.name}: BF16 pre-training {len(losses)} steps in {dt:.1f} s "
             f"({len(losses) / max(dt, 1e-9):.1f} steps/s), final loss {sum(tail) / len(tail):.4f}")
        return True

    def part_a(self):
        if not self.clock.allow(f"{self.task.name} (a) PTQ evaluation"):
            return
        for name, st in self.ptq:
            self._eval(BASE, name, st)
        _log(f"{self.task.name}: (a) PTQ evaluated ({', '.join(n for n, _ in self.ptq)})")
        self._finetune(CONTROL, None)
        self._finetune(ABLATIONS[0][0], dict(op="qat", kwargs=ABLATIONS[0][1]))

    def part_c(self):
        if not self.clock.allow(f"{self.task.name} (c) Thrift evaluation"):
            return
        for name, st in self.ptq[:2]:   # bf16 and nvfp4 PTQ: the two ends of the gap
            self._eval(BASE, name, st)
        for name, st in self.thrift:
            self._eval(BASE, name, st)
        _log(f"{self.task.name}: (c) Thrift evaluated (budgets {', '.join(n for n, _ in self.thrift)})")

    def part_d(self):
        if not self.clock.allow(f"{self.task.name} (d) orderings on captured Q/K/V"):
            return
        t = time.time()
        captured = self.task.capture(self.model)
        self.captured_shapes = [tuple(q.shape) for q, *_ in captured]
        self.d_rows = measure_recipes(self.task.name, captured)
        self.seconds["(d)"] = time.time() - t
        _log(f"{self.task.name}: (d) {len(captured)} layers of Q/K/V {self.captured_shapes[0]} "
             f"({captured[0][0].dtype}) measured with {len(D_RECIPES)} recipes")

    def part_b(self):
        self._finetune(CONTROL, None)
        for run, kw in ABLATIONS:
            self._finetune(run, dict(op="qat", kwargs=kw))


def measure_recipes(model_name: str, captured: list[tuple]) -> list[dict]:
    """Every recipe of :data:`D_RECIPES` on every captured layer, against exact float64 causal attention."""
    import fp4attn

    from ..accuracy import RECIPES, exact_attention
    from ..metrics import all_metrics

    rows = []
    for i, (q, k, v, scale) in enumerate(captured):
        ref = exact_attention(q, k, v, causal=True, scale=scale)
        for r in D_RECIPES:
            out = fp4attn.attention(q, k, v, causal=True, scale=scale, **RECIPES[r])
            rows.append({"kind": f"{model_name} L{i}", "model": model_name, "layer": i, "recipe": r,
                         "shape": "x".join(str(n) for n in q.shape), "dtype": str(q.dtype).replace("torch.", ""),
                         **all_metrics(out, ref)})
    return rows


def check_claims(rows: list[dict]) -> list[dict]:
    """Per model and claim: in how many layers the better recipe wins on CosSim, relative L1 and RMSE
    (the three metrics of SageAttention3's Table 1; the same rule as ``fp4attn accuracy``)."""
    by = {(r["model"], r["layer"], r["recipe"]): r for r in rows}
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        layers = sorted({r["layer"] for r in rows if r["model"] == model})
        for text, good, bad in _claims():
            pairs = [(by[(model, i, good)], by[(model, i, bad)]) for i in layers
                     if (model, i, good) in by and (model, i, bad) in by]
            if not pairs:
                continue
            holds = sum(1 for x, y in pairs
                        if x["cossim"] > y["cossim"] and x["rel_l1"] < y["rel_l1"] and x["rmse"] < y["rmse"])
            out.append({"model": model, "claim": text, "better": good, "worse": bad, "layers_holding": holds,
                        "layers": len(pairs), "rel_l1_better": _mean(x["rel_l1"] for x, _ in pairs),
                        "rel_l1_worse": _mean(y["rel_l1"] for _, y in pairs),
                        "cossim_better": _mean(x["cossim"] for x, _ in pairs),
                        "cossim_worse": _mean(y["cossim"] for _, y in pairs)})
    return out


# ------------------------------------------------------------------------------------------------
# numbers
# ------------------------------------------------------------------------------------------------
def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _median(xs) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _quantile(xs, q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def recovered(x: float, fp4: float, ref: float, higher_is_better: bool, min_gap: float = 1e-9) -> float:
    """Share of the FP4 → reference gap closed by ``x`` (nan when there is no gap)."""
    gap = (ref - fp4) if higher_is_better else (fp4 - ref)
    if not (gap > min_gap) or any(t != t for t in (x, fp4, ref)):
        return float("nan")
    return ((x - fp4) if higher_is_better else (fp4 - x)) / gap


def grad_norm_stats(gn: list[float]) -> dict:
    fin = [g for g in gn if math.isfinite(g)]
    logs = [math.log10(g) for g in fin if g > 0]
    rough = _mean(abs(b - a) for a, b in zip(logs, logs[1:])) if len(logs) > 1 else float("nan")
    return {"gn_median": _median(fin), "gn_p95": _quantile(fin, 0.95), "gn_max": max(fin) if fin else float("nan"),
            "gn_roughness": rough, "nonfinite_steps": len(gn) - len(fin)}


def _fmt(x, digits=3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _pct(x) -> str:
    return "—" if x is None or x != x else f"{100 * x:.0f}%"


def _table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _mean_over(ev: dict, key: str) -> float:
    return _mean(v[key] for v in ev.values())


# ------------------------------------------------------------------------------------------------
# report: tables and CSVs
# ------------------------------------------------------------------------------------------------
def rows_a(r: _Runner) -> list[dict]:
    """One dict per (weights, attention) of part (a), with per-context values, means and recovery."""
    t = r.task
    prim = "acc" if t.has_acc else "loss"
    hib = t.has_acc
    order = [(BASE, n) for n, _ in r.ptq] + [(CONTROL, "bf16"), (CONTROL, "nvfp4"),
                                            (ABLATIONS[0][0], "bf16"), (ABLATIONS[0][0], "nvfp4")]
    out = []
    for w, a in order:
        ev = r.evals.get((w, a))
        if ev is None:
            continue
        row = {"model": t.name, "weights": w, "attention": a, "per_ctx": ev,
               "mean_acc": _mean_over(ev, "acc"), "mean_loss": _mean_over(ev, "loss")}
        # recovery: PTQ rows against the BF16-trained gap, Attn-QAT's FP4 row against the control's gap
        ref_w = CONTROL if w == ABLATIONS[0][0] else BASE
        lo = r.evals.get((ref_w, "nvfp4 PTQ" if ref_w == BASE else "nvfp4"))
        hi = r.evals.get((ref_w, "bf16"))
        rec = {}
        if lo is not None and hi is not None and a not in ("bf16",) and not (w == CONTROL):
            for key, hb, min_gap in (("acc", True, 1e-9), ("loss", False, 1e-4)):
                rec[key] = recovered(row[f"mean_{key}"], _mean_over(lo, key), _mean_over(hi, key), hb, min_gap)
        row["recovered_acc"] = rec.get("acc", float("nan"))
        row["recovered_loss"] = rec.get("loss", float("nan"))
        row["primary"] = prim
        row["higher_is_better"] = hib
        out.append(row)
    return out


def md_a(r: _Runner) -> str:
    t = r.task
    rows = rows_a(r)
    if not rows:
        return f"_{t.name}: not run._"
    ctx = t.contexts
    if t.has_acc:
        head = ["weights", "attention"] + [f"acc@{c}" for c in ctx] + ["mean acc", "mean loss", "recovered (acc)",
                                                                        "recovered (loss)"]
        body = [[x["weights"], x["attention"]] + [_fmt(x["per_ctx"][c]["acc"]) for c in ctx] +
                [_fmt(x["mean_acc"]), _fmt(x["mean_loss"]), _pct(x["recovered_acc"]), _pct(x["recovered_loss"])]
                for x in rows]
    else:
        head = ["weights", "attention"] + [f"loss@{c}" for c in ctx] + ["mean loss", "recovered"]
        body = [[x["weights"], x["attention"]] + [_fmt(x["per_ctx"][c]["loss"], 4) for c in ctx] +
                [_fmt(x["mean_loss"], 4), _pct(x["recovered_loss"])] for x in rows]
    lines = [_table(head, body), ""]
    base_bf16, base_fp4 = r.evals.get((BASE, "bf16")), r.evals.get((BASE, "nvfp4 PTQ"))
    if base_bf16 and base_fp4:
        d = _mean_over(base_fp4, "loss") - _mean_over(base_bf16, "loss")
        lines.append(f"nvfp4 PTQ vs BF16 on the BF16-trained weights: mean loss {d:+.4f}" +
                     (f", mean accuracy {_mean_over(base_fp4, 'acc') - _mean_over(base_bf16, 'acc'):+.3f}"
                      if t.has_acc else "") + ".")
    qat = next((x for x in rows if x["weights"] == ABLATIONS[0][0] and x["attention"] == "nvfp4"), None)
    if qat is not None:
        lines.append(f"Attn-QAT (nvfp4 inference) recovers {_pct(qat['recovered_loss'])} of the control's "
                     "nvfp4-PTQ → BF16 loss gap" +
                     (f" and {_pct(qat['recovered_acc'])} of its accuracy gap" if t.has_acc else "") + ".")
    return "\n".join(lines)


def csv_a(runners) -> list[list]:
    out = []
    for r in runners:
        for x in rows_a(r):
            for c, v in x["per_ctx"].items():
                out.append([x["model"], x["weights"], x["attention"], c, v["acc"], v["loss"],
                            x["recovered_acc"], x["recovered_loss"]])
    return out


def rows_b(r: _Runner) -> list[dict]:
    out = []
    for run in [CONTROL] + [n for n, _ in ABLATIONS]:
        cur = r.curves.get(run)
        if cur is None:
            continue
        ls = cur["loss"]
        tail = ls[-max(1, len(ls) // 10):]
        fp4, bf = r.evals.get((run, "nvfp4"), {}), r.evals.get((run, "bf16"), {})
        out.append({"model": r.task.name, "run": run, "steps": len(ls), "final_train_loss": _mean(tail),
                    "eval_nvfp4_loss": _mean_over(fp4, "loss") if fp4 else float("nan"),
                    "eval_nvfp4_acc": _mean_over(fp4, "acc") if fp4 else float("nan"),
                    "eval_bf16_loss": _mean_over(bf, "loss") if bf else float("nan"),
                    "eval_bf16_acc": _mean_over(bf, "acc") if bf else float("nan"),
                    **grad_norm_stats(cur["grad_norm"])})
    return out


def md_b(r: _Runner) -> str:
    rows = rows_b(r)
    if not rows:
        return f"_{r.task.name}: not run._"
    acc = r.task.has_acc
    head = ["run", "steps", "final train loss", "eval loss nvfp4", "eval loss bf16"] + \
           (["eval acc nvfp4", "eval acc bf16"] if acc else []) + \
           ["grad norm median", "p95", "max", "roughness", "non-finite"]
    body = [[x["run"], x["steps"], _fmt(x["final_train_loss"], 4), _fmt(x["eval_nvfp4_loss"], 4),
             _fmt(x["eval_bf16_loss"], 4)] + ([_fmt(x["eval_nvfp4_acc"]), _fmt(x["eval_bf16_acc"])] if acc else []) +
            [_fmt(x["gn_median"], 3), _fmt(x["gn_p95"], 3), _fmt(x["gn_max"], 3), _fmt(x["gn_roughness"], 3),
             x["nonfinite_steps"]] for x in rows]
    return _table(head, body)


def rows_c(r: _Runner) -> list[dict]:
    from ..reference.thrift import budget_to_k

    bf, fp = r.evals.get((BASE, "bf16")), r.evals.get((BASE, "nvfp4 PTQ"))
    if bf is None or fp is None:
        return []
    out = []
    for (name, _), b in zip(r.thrift, THRIFT_BUDGETS):
        ev = r.evals.get((BASE, name))
        if ev is None:
            continue
        for c in r.task.contexts:
            n = r.task.thrift_blocks(c)
            out.append({"model": r.task.name, "context": c, "budget": b, "k": budget_to_k(b, n, True), "n_blocks": n,
                        "acc": ev[c]["acc"], "loss": ev[c]["loss"], "bf16_acc": bf[c]["acc"],
                        "bf16_loss": bf[c]["loss"], "nvfp4_acc": fp[c]["acc"], "nvfp4_loss": fp[c]["loss"],
                        "recovery_loss": recovered(ev[c]["loss"], fp[c]["loss"], bf[c]["loss"], False, 1e-4),
                        "recovery_acc": recovered(ev[c]["acc"], fp[c]["acc"], bf[c]["acc"], True)})
    return out


def md_c(r: _Runner) -> str:
    rows = rows_c(r)
    if not rows:
        return f"_{r.task.name}: not run._"
    acc = r.task.has_acc
    by = {(x["context"], x["budget"]): x for x in rows}
    budgets = sorted({x["budget"] for x in rows})
    head = ["context", "bf16 loss", "nvfp4 loss"] + [f"thrift {b:.0%} loss (k/n)" for b in budgets] + \
           [f"recovery {b:.0%}" for b in budgets]
    body = []
    for c in r.task.contexts:
        x0 = by[(c, budgets[0])]
        body.append([c, _fmt(x0["bf16_loss"], 4), _fmt(x0["nvfp4_loss"], 4)] +
                    [f"{_fmt(by[(c, b)]['loss'], 4)} ({by[(c, b)]['k']}/{by[(c, b)]['n_blocks']})" for b in budgets] +
                    [_pct(by[(c, b)]["recovery_loss"]) for b in budgets])
    lines = [_table(head, body)]
    if acc:
        head = ["context", "bf16 acc", "nvfp4 acc"] + [f"thrift {b:.0%} acc" for b in budgets] + \
               [f"recovery {b:.0%}" for b in budgets]
        body = [[c, _fmt(by[(c, budgets[0])]["bf16_acc"]), _fmt(by[(c, budgets[0])]["nvfp4_acc"])] +
                [_fmt(by[(c, b)]["acc"]) for b in budgets] + [_pct(by[(c, b)]["recovery_acc"]) for b in budgets]
                for c in r.task.contexts]
        lines += ["", _table(head, body)]
    mean_rec = {b: _mean(by[(c, b)]["recovery_loss"] for c in r.task.contexts
                         if by[(c, b)]["recovery_loss"] == by[(c, b)]["recovery_loss"]) for b in budgets}
    lines += ["", "Mean loss-gap recovery over contexts: " +
              ", ".join(f"{b:.0%}: {_pct(mean_rec[b])}" for b in budgets) + "."]
    return "\n".join(lines)


def md_d(r: _Runner) -> str:
    if not r.d_rows:
        return f"_{r.task.name}: not run._"
    mean_rows = []
    for rec in D_RECIPES:
        xs = [x for x in r.d_rows if x["recipe"] == rec]
        mean_rows.append([rec, f"{_mean(x['cossim'] for x in xs):.5f}", f"{_mean(x['rel_l1'] for x in xs):.4f}",
                          f"{_mean(x['rmse'] for x in xs):.4g}", f"{_mean(x['rel_l2'] for x in xs):.4f}"])
    x0 = r.d_rows[0]
    lines = [f"Q/K/V of {len(r.captured_shapes)} layers, each {x0['shape']} ({x0['dtype']}), causal; "
             "mean over layers:", "",
             _table(["recipe", "CosSim", "Rel. L1", "RMSE", "Rel. L2"], mean_rows), ""]
    claims = check_claims(r.d_rows)
    lines.append(_table(["claim", "holds in layers", "Rel. L1 (better / worse)", "CosSim (better / worse)"],
                        [[c["claim"], f"{c['layers_holding']}/{c['layers']}",
                          f"{c['rel_l1_better']:.4f} / {c['rel_l1_worse']:.4f}",
                          f"{c['cossim_better']:.5f} / {c['cossim_worse']:.5f}"] for c in claims]))
    lines += ["", "<details><summary>per layer</summary>", "",
              _table(["layer", "recipe", "CosSim", "Rel. L1", "RMSE", "Rel. L2"],
                     [[x["layer"], x["recipe"], f"{x['cossim']:.5f}", f"{x['rel_l1']:.4f}", f"{x['rmse']:.4g}",
                       f"{x['rel_l2']:.4f}"] for x in r.d_rows]), "", "</details>"]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------
def _smooth(xs: list[float], w: int) -> list[float]:
    out, acc, q = [], 0.0, []
    for x in xs:
        q.append(x)
        acc += x
        if len(q) > w:
            acc -= q.pop(0)
        out.append(acc / len(q))
    return out


def plots(out: str, runners: list[_Runner]) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _log("matplotlib not installed: no PNGs (pip install 'fp4attn[plot]')")
        return []
    paths = []
    rs = [r for r in runners if r.curves]
    if rs:  # (a) training curves
        fig, axes = plt.subplots(1, len(rs), figsize=(6.5 * len(rs), 4.2), squeeze=False)
        for ax, r in zip(axes[0], rs):
            pre = r.curves.get("BF16 pre-training", {"loss": []})["loss"]
            ax.plot(range(len(pre)), _smooth(pre, max(1, len(pre) // 50)), label="BF16 pre-training", color="k")
            for run, color in ((CONTROL, "tab:blue"), (ABLATIONS[0][0], "tab:red")):
                if run in r.curves:
                    ls = r.curves[run]["loss"]
                    ax.plot(range(len(pre), len(pre) + len(ls)), _smooth(ls, max(1, len(ls) // 25)),
                            label=f"{run} fine-tune", color=color)
            ax.set_yscale("log")
            ax.set_xlabel("step")
            ax.set_ylabel("training loss (moving average)")
            ax.set_title(f"{r.task.name}: (a) training")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(os.path.join(out, "reproduce_a_loss.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    rs = [r for r in runners if any(n in r.curves for n, _ in ABLATIONS[1:])]
    if rs:  # (b) gradient norms and losses of the ablations
        fig, axes = plt.subplots(len(rs), 2, figsize=(13, 4.2 * len(rs)), squeeze=False)
        colors = {CONTROL: "tab:gray", "Attn-QAT": "tab:red", "no O' (D from O)": "tab:purple",
                  "no P re-quant in bwd": "tab:green", "naive FA backward": "tab:orange"}
        for row, r in zip(axes, rs):
            for run in [CONTROL] + [n for n, _ in ABLATIONS]:
                if run not in r.curves:
                    continue
                c = r.curves[run]
                row[0].plot(range(len(c["grad_norm"])), c["grad_norm"], lw=0.8, color=colors[run], label=run)
                row[1].plot(range(len(c["loss"])), _smooth(c["loss"], max(1, len(c["loss"]) // 25)),
                            color=colors[run], label=run)
            row[0].set_ylabel("gradient norm (before clipping)")
            row[1].set_ylabel("training loss (moving average)")
            for ax, what in zip(row, ("gradient norm", "loss")):
                ax.set_yscale("log")
                ax.set_xlabel("fine-tune step")
                ax.set_title(f"{r.task.name}: (b) Attn-QAT ablations, {what}")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(os.path.join(out, "reproduce_b_grad_norm.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    rs = [r for r in runners if rows_c(r)]
    if rs:  # (c) Thrift recovery vs budget and context
        fig, axes = plt.subplots(len(rs), 2, figsize=(13, 4.2 * len(rs)), squeeze=False)
        for row, r in zip(axes, rs):
            rows = rows_c(r)
            for c in r.task.contexts:
                xs = [x for x in rows if x["context"] == c]
                row[0].plot([100 * x["budget"] for x in xs], [100 * x["recovery_loss"] for x in xs], marker="o",
                            label=f"context {c}")
            row[0].axhline(100, color="k", lw=0.6, ls="--")
            row[0].axhline(0, color="k", lw=0.6)
            row[0].set_xscale("log")
            row[0].set_xticks([100 * b for b in THRIFT_BUDGETS], [f"{b:.0%}" for b in THRIFT_BUDGETS])
            row[0].minorticks_off()
            row[0].set_xlabel("Thrift budget (share of key blocks in 16 bits)")
            row[0].set_ylabel("recovered share of the nvfp4 → BF16 loss gap (%)")
            row[0].set_title(f"{r.task.name}: (c) Thrift recovery vs budget")
            key = "acc" if r.task.has_acc else "loss"
            ctxs = r.task.contexts
            by = {(x["context"], x["budget"]): x for x in rows}
            row[1].plot(ctxs, [by[(c, THRIFT_BUDGETS[0])][f"bf16_{key}"] for c in ctxs], "k-o", label="bf16")
            row[1].plot(ctxs, [by[(c, THRIFT_BUDGETS[0])][f"nvfp4_{key}"] for c in ctxs], "r-o", label="nvfp4 PTQ")
            for b in THRIFT_BUDGETS:
                row[1].plot(ctxs, [by[(c, b)][key] for c in ctxs], "--", marker=".", label=f"thrift {b:.0%}")
            row[1].set_xscale("log", base=2)
            row[1].set_xticks(ctxs, [str(c) for c in ctxs])
            row[1].minorticks_off()
            row[1].set_xlabel("context length")
            row[1].set_ylabel("accuracy" if key == "acc" else "held-out loss (nats/char)")
            row[1].set_title(f"{r.task.name}: (c) vs context length")
            for ax in row:
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(out, "reproduce_c_thrift.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    d_rows = [x for r in runners for x in r.d_rows]
    if d_rows:  # (d) bar chart, one group per captured layer
        from ..accuracy import plot as accuracy_plot
        paths.append(os.path.join(out, "reproduce_d_orderings.png"))
        accuracy_plot(d_rows, paths[-1], title="(d) FP4 recipes on captured Q/K/V vs exact attention")
    return paths


# ------------------------------------------------------------------------------------------------
# parallel kernel compilation (CUDA only; best effort: the main process compiles whatever is missing)
# ------------------------------------------------------------------------------------------------
def _warm_specs(tasks, parts) -> list[tuple]:
    specs = []
    for t in tasks:
        h, d = t.head_shape()
        infer_dt = "float32" if isinstance(t, _SyntheticTask) else "bfloat16"  # the demo evaluates in float32
        if {"a", "c", "d"} & set(parts):
            specs += [("attention", h, d, infer_dt, r) for r in ("bf16",) + D_RECIPES]
            if t.thrift_block == 64:  # other block sizes run the op's PyTorch reference (no kernel)
                specs.append(("thrift", h, d, infer_dt, t.thrift_block))
        if {"a", "b"} & set(parts):
            specs += [("qat", h, d, "bfloat16", tuple(sorted(kw.items()))) for _, kw in ABLATIONS]
    return list(dict.fromkeys(specs))


def _warm_one(spec):
    op, h, d, dt, arg = spec
    try:
        import fp4attn

        from ..accuracy import RECIPES
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(2, h, 256, d, device="cuda", dtype=getattr(torch, dt), generator=g) for _ in range(3))
        if op == "attention":
            fp4attn.attention(q, k, v, causal=True, **RECIPES[arg])
        elif op == "thrift":
            fp4attn.thrift_attention(q, k, v, causal=True, budget=0.1, block_size=arg)
        else:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            fp4attn.attn_qat(q, k, v, causal=True, **dict(arg)).float().square().sum().backward()
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001 - reported; the main process will compile (or fail) itself
        return f"{spec}: {type(e).__name__}: {str(e)[:200]}"


def warm_kernels(specs, jobs: int) -> float:
    from concurrent.futures import ProcessPoolExecutor

    t = time.time()
    try:
        ctx = torch.multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(specs))), mp_context=ctx) as ex:
            errors = [e for e in ex.map(_warm_one, specs) if e]
    except Exception as e:  # noqa: BLE001 - an optimization only: the run compiles in-process instead
        errors = [f"the process pool failed: {type(e).__name__}: {e}"]
    dt = time.time() - t
    _log(f"kernel warm-up: {len(specs)} variants compiled in {jobs} processes in {dt:.1f} s"
         + (f"; {len(errors)} failed (compiled in-process later): {errors[0]}" if errors else ""))
    return dt


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fp4attn bench reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="text file for the LM (e.g. tinyshakespeare.txt); "
                    "without it the LM part is skipped")
    ap.add_argument("--out", default=os.path.join(".", "fp4attn-out", "reproduce"), help="output folder")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of a,b,c,d")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of lm,synthetic")
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke setting (CPU tests)")
    ap.add_argument("--device", type=device_arg, default=None, help="cpu / cuda (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every model init, batch order, eval set")
    ap.add_argument("--minutes", type=float, default=None,
                    help="skip every phase that would start after this much wall time (default: no limit)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every step count (pre-training, fine-tunes; also those given below)")
    lm, syn = LMConfig(), demo.Settings()
    ap.add_argument("--lm-pretrain-steps", type=int, default=None, help=f"default {lm.pretrain_steps}")
    ap.add_argument("--lm-ft-steps", type=int, default=None,
                    help=f"steps of each of the 5 LM fine-tunes (default {lm.ft_steps})")
    ap.add_argument("--syn-pretrain-steps", type=int, default=None, help=f"default {syn.train_steps}")
    ap.add_argument("--syn-ft-steps", type=int, default=None,
                    help=f"steps of each of the 5 synthetic fine-tunes (default {syn.qat_steps})")
    ap.add_argument("--warm-jobs", type=int, default=12,
                    help="CUDA: processes compiling the Triton kernels before the run (0: off)")
    ap.add_argument("--autotune", action="store_true", help="keep Attn-QAT kernel autotuning on (CUDA)")
    return ap


def _split(text: str, allowed, what: str) -> list[str]:
    xs = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in xs if x not in allowed]
    if bad or not xs:
        raise ValueError(f"--{what} must be a comma-separated subset of {','.join(allowed)}, got {text!r}")
    return [x for x in allowed if x in xs]


def _pick(value, default):
    return default if value is None else value


def _steps(n: int, scale: float) -> int:
    """``n`` (a step option or its default) times ``--scale``, at least 1."""
    return max(1, int(round(n * scale)))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        parts = _split(args.parts, PARTS, "parts")
        models = _split(args.models, MODELS, "models")
    except ValueError as e:
        print(f"fp4attn bench reproduce: {e}", file=sys.stderr)
        return 2
    _T0[0] = time.time()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not args.autotune:
        os.environ.setdefault("FP4ATTN_AUTOTUNE", "0")
    os.makedirs(args.out, exist_ok=True)
    size = "tiny" if args.tiny else "default"

    tasks, notes = [], []
    if "lm" in models:
        if args.data:
            cfg = LMConfig(**(LM_TINY if args.tiny else {}))
            cfg.pretrain_steps = _steps(_pick(args.lm_pretrain_steps, cfg.pretrain_steps), args.scale)
            cfg.ft_steps = _steps(_pick(args.lm_ft_steps, cfg.ft_steps), args.scale)
            tasks.append(_LMTask(cfg, args.data, device, args.seed))
        else:
            notes.append("LM part skipped: no --data given (e.g. --data tinyshakespeare.txt).")
            _log(notes[-1])
    if "synthetic" in models:
        s = demo.Settings(**demo.SIZES[size])
        s.seed = args.seed
        s.thrift_budgets = list(THRIFT_BUDGETS)
        s.train_steps = _steps(_pick(args.syn_pretrain_steps, s.train_steps), args.scale)
        s.qat_steps = _steps(_pick(args.syn_ft_steps, s.qat_steps), args.scale)
        tasks.append(_SyntheticTask(s, device, SYN_CAPTURE_BATCH[size]))
    if not tasks:
        print("fp4attn bench reproduce: nothing to run (no --data and synthetic not selected)", file=sys.stderr)
        return 2
    for t in tasks:
        _log(t.describe())

    run = types.SimpleNamespace(args=args, argv=argv, device=device, parts=parts, size=size, tasks=tasks, notes=notes,
                                warm_s=None, clock=_Clock(args.minutes), runners=[], complete=False)
    if device.type == "cuda" and args.warm_jobs > 0:
        run.warm_s = warm_kernels(_warm_specs(tasks, parts), min(args.warm_jobs, os.cpu_count() or 1))
    run.runners = [_Runner(t, parts, run.clock) for t in tasks]
    ok = [r.pretrain() for r in run.runners]
    # cheap and central phases first for both models, the fine-tune-heavy ablations last; the report is
    # rewritten after each stage, so that an interrupted run leaves what it has measured
    for r, good in zip(run.runners, ok):
        if not good:
            continue
        if "a" in parts:
            r.part_a()
        if "c" in parts:
            r.part_c()
        if "d" in parts:
            r.part_d()
        write_report(run)
    if "b" in parts:
        write_report(run, with_plots=True)
        for r, good in zip(run.runners, ok):
            if good:
                r.part_b()
                write_report(run)
    run.complete = True
    pngs = write_report(run, with_plots=True)

    # ---- a short summary for the console (the tables are in reproduce.md)
    for r in run.runners:
        for x in rows_a(r):
            if x["weights"] == ABLATIONS[0][0] and x["attention"] == "nvfp4":
                _log(f"{r.task.name} (a): Attn-QAT recovers {_pct(x['recovered_loss'])} of the loss gap"
                     + (f", {_pct(x['recovered_acc'])} of the accuracy gap" if r.task.has_acc else ""))
        for x in rows_b(r):
            _log(f"{r.task.name} (b): {x['run']}: final train loss {x['final_train_loss']:.4f}, eval nvfp4 loss "
                 f"{x['eval_nvfp4_loss']:.4f}, grad norm median {x['gn_median']:.3g} max {x['gn_max']:.3g}")
        for c in check_claims(r.d_rows):
            _log(f"{r.task.name} (d): {c['claim']}: {c['layers_holding']}/{c['layers']} layers")
    _log(f"done in {time.time() - _T0[0]:.0f} s; wrote {os.path.join(args.out, 'reproduce.md')}, CSVs"
         + (f", {len(pngs)} PNGs" if pngs else ""))
    return 0


_SECTIONS = (
    ("a", "(a) FP4 PTQ degrades, Attn-QAT recovers", md_a,
     "BF16-trained rows: the pre-trained weights evaluated with each attention (PTQ). BF16 control / "
     "Attn-QAT rows: those weights after the same number of further steps with BF16 attention / with "
     "Attn-QAT (NVFP4), on the same batches. recovered: share of the nvfp4 → BF16 gap closed — for PTQ "
     "rows of the BF16-trained weights' gap, for the Attn-QAT nvfp4 row of the BF16 control's gap (equal "
     "training); — where that gap is below 1e-4 nats (loss) or zero (accuracy)."),
    ("b", "(b) Attn-QAT ablations (Table 2, Fig. 3)", md_b,
     "Each run: the fine-tune of (a) from the BF16-trained weights, same batches and schedule. Final train "
     "loss: mean of the last 10% of steps, with the attention the run trains with. Eval: mean over contexts "
     "with nvfp4 inference / BF16 attention. Grad norm: total norm before clipping to 1.0; roughness: mean "
     "|Δ log10 grad norm| between consecutive steps."),
    ("c", "(c) ThriftAttention recovery vs budget and context length", md_c,
     "BF16-trained weights. k/n: key blocks per query block in 16 bits / key blocks (causal budget formula "
     "of SPEC §3). recovery: share of the nvfp4-PTQ → BF16 loss gap (per context) closed by Thrift. Thrift "
     "blocks of 64 tokens run the Triton kernel on CUDA; other block sizes (the synthetic task's 16, as in "
     "fp4attn demo) run the op's PyTorch reference (same semantics)."),
    ("d", "(d) SageAttention3 orderings on captured Q/K/V", md_d,
     "Q, K, V after RoPE captured with forward hooks from the BF16-trained model (the longest evaluation "
     "context), each recipe against exact float64 causal attention of the same inputs. A claim holds in a "
     "layer when the first recipe is better on CosSim, Rel. L1 and RMSE."),
)


def write_report(run, with_plots: bool = False) -> list[str]:
    """(Re)write reproduce.md, the CSVs and the JSON from what ``run`` has measured so far; with
    ``with_plots`` also the PNGs (returns their paths)."""
    args, runners, clock, out = run.args, run.runners, run.clock, run.args.out
    wall = time.time() - _T0[0]
    dev = device_name() if run.device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    import fp4attn
    versions = f"fp4attn {fp4attn.__version__}, torch {torch.__version__}"
    try:
        import triton
        versions += f", triton {triton.__version__}"
    except ImportError:
        pass
    cmd = "fp4attn bench reproduce " + shlex.join(run.argv)
    env = {k: os.environ[k] for k in ("FP4ATTN_AUTOTUNE", "FP4ATTN_FORCE_REFERENCE", "FP4ATTN_ATTN_OPERANDS")
           if k in os.environ}
    md = ["# fp4attn bench reproduce", "",
          f"device: {dev} ({versions}) | date: {now_utc()} | wall: {wall:.0f} s"
          + (f" (parallel kernel compilation {run.warm_s:.0f} s)" if run.warm_s is not None else ""),
          f"settings: parts {','.join(run.parts)}; size {run.size}; seed {args.seed}; scale {args.scale}"
          + (f"; env {' '.join(f'{k}={v}' for k, v in env.items())}" if env else ""),
          *[f"- {t.describe()}" for t in run.tasks],
          f"command: `{cmd}`", ""]
    if not run.complete:
        md.append("NOTE: run in progress or interrupted — this report holds what was measured so far.")
    md += [f"NOTE: {n}" for n in run.notes]
    if clock.skipped:
        md.append(f"NOTE: --minutes {args.minutes} time guard skipped: {'; '.join(clock.skipped)}.")
    md.append("")
    for p, title, fn, expl in _SECTIONS:
        if p not in run.parts:
            continue
        md += [f"## {title}", "", expl, ""]
        for r in runners:
            md += [f"### {r.task.name}", "", fn(r), ""]
    md.append("Phase wall times (s): " + "; ".join(
        f"{r.task.name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.seconds.items()) for r in runners))
    with open(os.path.join(out, "reproduce.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    write_csv(os.path.join(out, "reproduce_a.csv"),
              ["model", "weights", "attention", "context", "accuracy", "loss", "recovered_acc", "recovered_loss"],
              csv_a(runners))
    bk = ["model", "run", "steps", "final_train_loss", "eval_nvfp4_loss", "eval_nvfp4_acc", "eval_bf16_loss",
          "eval_bf16_acc", "gn_median", "gn_p95", "gn_max", "gn_roughness", "nonfinite_steps"]
    write_csv(os.path.join(out, "reproduce_b.csv"), bk, [[x[k] for k in bk] for r in runners for x in rows_b(r)])
    ck = ["model", "context", "budget", "k", "n_blocks", "acc", "loss", "bf16_acc", "bf16_loss", "nvfp4_acc",
          "nvfp4_loss", "recovery_loss", "recovery_acc"]
    write_csv(os.path.join(out, "reproduce_c.csv"), ck, [[x[k] for k in ck] for r in runners for x in rows_c(r)])
    dk = ["model", "layer", "shape", "dtype", "recipe", "cossim", "rel_l1", "rmse", "rel_l2"]
    write_csv(os.path.join(out, "reproduce_d.csv"), dk, [[x[k] for k in dk] for r in runners for x in r.d_rows])
    clk = ["model", "claim", "better", "worse", "layers_holding", "layers", "rel_l1_better", "rel_l1_worse",
           "cossim_better", "cossim_worse"]
    write_csv(os.path.join(out, "reproduce_d_claims.csv"), clk,
              [[c[k] for k in clk] for c in check_claims([x for r in runners for x in r.d_rows])])
    write_csv(os.path.join(out, "reproduce_curves.csv"), ["model", "run", "step", "loss", "grad_norm"],
              [[r.task.name, name, i, lo, g] for r in runners for name, c in r.curves.items()
               for i, (lo, g) in enumerate(zip(c["loss"], c["grad_norm"]))])
    with open(os.path.join(out, "reproduce.json"), "w") as f:
        json.dump({"device": dev, "versions": versions, "command": cmd, "wall_s": wall, "parts": run.parts,
                   "complete": run.complete, "skipped": clock.skipped, "notes": run.notes,
                   "lm": next((asdict(t.cfg) for t in run.tasks if isinstance(t, _LMTask)), None),
                   "synthetic": next((asdict(t.s) for t in run.tasks if isinstance(t, _SyntheticTask)), None),
                   "evals": [{"model": r.task.name, "weights": w, "attention": a,
                              "per_context": {str(c): v for c, v in ev.items()}}
                             for r in runners for (w, a), ev in r.evals.items()],
                   "seconds": {r.task.name: r.seconds for r in runners}}, f, indent=1)
    return plots(out, runners) if with_plots else []


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
