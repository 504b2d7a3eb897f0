"""Attn-QAT for 🤗 transformers models: :func:`prepare`, and the ``fp4attn qat`` command.

```python
import fp4attn.qat
model = fp4attn.qat.prepare(model, fmt="nvfp4")   # training mode: Attn-QAT; eval mode: FP4 inference
```

``fp4attn qat`` fine-tunes a causal LM — a local transformers checkpoint directory (``--model``) or
a tiny Llama built from a config (the default; it is first pre-trained for ``--pretrain-steps``
with BF16 attention so that there is something to fine-tune) — on a text file (``--text``) or an
embedded default text, with Attn-QAT attention (:func:`fp4attn.attn_qat`: fake-quantized FP4
forward, Algorithm-3 backward). Before and after the fine-tune it evaluates held-out loss and
perplexity with BF16 attention and with FP4 attention (post-training quantization of the starting
weights, then of the Attn-QAT weights). Progress bars, a checkpoint every ``--ckpt-every`` steps
(``--resume`` continues from it, bit-for-bit on the same data order), a results table
(``qat_results.md``, also printed, and ``.csv``) and ``qat_loss.png`` / ``qat_grad_norm.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time

import torch

from .integrations._common import check_recipe_mode

__all__ = ["prepare", "DEFAULT_TEXT"]


def prepare(model, fmt: str = "nvfp4", mode: str = "auto", name: str | None = None, **op_kwargs):
    """Switch a transformers model's attention to fp4attn Attn-QAT (in place; returns the model).

    Registers (see :func:`fp4attn.integrations.transformers.register`) ``recipe=fmt`` with
    ``mode="auto"``: while the model is in training mode each attention layer runs
    :func:`fp4attn.attn_qat` with ``fmt``; in eval mode it runs the matching FP4 inference op,
    so evaluating the prepared model measures the deployed FP4 accuracy. ``op_kwargs`` go to the op
    (e.g. ``backward="naive"`` or ``high_precision_o=False`` for the Attn-QAT ablations).
    """
    from .integrations.transformers import register
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"fmt must be 'nvfp4' or 'mxfp4', got {fmt!r}")
    check_recipe_mode(fmt, mode)
    cfg = getattr(model, "config", None)
    drop = getattr(cfg, "attention_dropout", 0.0) or getattr(cfg, "attention_probs_dropout_prob", 0.0) or 0.0
    if drop:
        import warnings
        warnings.warn(f"fp4attn.qat.prepare: the model has attention dropout {drop}; fp4attn ops have no dropout, "
                      "so training calls will fall back to full-precision attention. Set it to 0.", stacklevel=2)
    model.set_attn_implementation(register(fmt, name=name, mode=mode, **op_kwargs))
    return model


# ------------------------------------------------------------------------------------------------
# the default text: written for fp4attn (plain prose, a few kilobytes)
# ------------------------------------------------------------------------------------------------
DEFAULT_TEXT = """\
The lighthouse keeper kept a ledger of every ship that passed the point. In the first column he wrote
the hour, in the second the name painted on the bow, and in the third whatever he could guess of the
cargo from the way the hull sat in the water. A ship riding high carried wool or nothing at all; a
ship low and slow carried grain, stone or iron. He was wrong often enough, but the ledger did not
care, and neither did he. What mattered was that the lamp was lit at dusk and put out at dawn, that
the glass was clean, and that the oil never ran short in the middle of a winter night.

His daughter learned the lamp before she learned her letters. She could trim a wick by the time she
could reach the table, and she knew the sound the clockwork made when the weights needed winding.
When the inspector came each spring he asked her questions to catch her out: how many flashes, how
long the dark between them, how far the beam carried on a clear night. She answered every one, and
the inspector wrote in his own ledger that the station was in good order.

In the town below, the baker rose two hours before the sun. He mixed flour, water, salt and a little
of yesterday's dough, and he left it under a cloth by the warm wall of the oven. By the time the
first fishermen walked down to the harbour the loaves were cooling on the rack, and the smell of them
followed the men all the way to their boats. The baker counted the loaves as they went out the door
and counted the coins as they came in, and the two numbers agreed more often than not.

The schoolmaster taught arithmetic with a box of pebbles. Ten pebbles made a row, ten rows made a
square, and ten squares stacked one on another made a block that no child could lift. He would set a
block on the desk and ask how many pebbles were in it, and when someone answered a thousand he would
ask how many blocks it would take to fill the room. The children guessed wildly, then measured the
room with string, then argued, and by the end of the week every one of them could multiply.

A storm came in the autumn of the year the harbour wall was finished. It blew for three days from the
south-west, and the waves broke over the new wall as if it were not there. On the second night a
small coaster lost her rudder off the point. The keeper saw her lights swing round and knew at once
what had happened. He sent his daughter down the cliff path with a lantern to wake the lifeboat crew,
and he stayed with the lamp, because a lamp that goes out in a storm is worse than no lamp at all.

The crew launched at midnight. They rowed for an hour to cover a distance a child could swim in
summer, and they came alongside the coaster just as she struck the outer rocks. Seven men were taken
off. The coaster broke up before morning, and for weeks afterwards the beach was littered with
barrel staves and split sacks of beans. The town ate beans all winter and told the story every time.

When the keeper grew old the board sent a young man to learn the station. He was clever and quick and
impatient with the ledger. Why write down the ships, he asked, when nobody ever reads it? The keeper
showed him the shelf where the old ledgers stood, forty years of them, and told him to pick one at
random and open it anywhere. The young man read a page, then another, and then sat down on the floor
and read until the light went. After that he kept the ledger without being told.

Years later a historian came to the point looking for the record of a ship that had vanished with a
cargo of clocks. She found it in the ledger in the keeper's hand: the hour, the name, and in the third
column the word clocks, with a question mark. The ship had passed the light riding low, heading north,
on the last clear evening before a week of fog. It was the last anyone had seen of her, and the
historian copied the line into her notebook and thanked the keeper's daughter, who was by then an old
woman herself and still lived in the cottage under the tower.
"""


# ------------------------------------------------------------------------------------------------
# data and models
# ------------------------------------------------------------------------------------------------
class ByteTokenizer:
    """Bytes as tokens (vocabulary 256), for the tiny model built from a config."""
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


def load_model_and_tokens(args, text: str):
    """(model, token ids 1-D LongTensor, description)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    if args.model:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
        return model, ids, f"checkpoint {args.model}"
    cfg = LlamaConfig(vocab_size=ByteTokenizer.vocab_size, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=max(2048, args.seq_len), tie_word_embeddings=True)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg)
    ids = torch.tensor(ByteTokenizer().encode(text), dtype=torch.long)
    desc = (f"tiny Llama from a config ({args.layers} layers, hidden {args.hidden}, {args.heads} heads / "
            f"{args.kv_heads} kv heads, byte tokens)")
    return model, ids, desc


class Windows:
    """Random training windows of ``seq_len + 1`` tokens from ``ids``, reproducible via ``state``."""

    def __init__(self, ids: torch.Tensor, seq_len: int, batch: int, seed: int):
        if ids.numel() < seq_len + 2:
            raise ValueError(f"text too short ({ids.numel()} tokens) for --seq-len {seq_len}")
        self.ids, self.seq_len, self.batch = ids, seq_len, batch
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        starts = torch.randint(0, self.ids.numel() - self.seq_len - 1, (self.batch,), generator=self.gen)
        return torch.stack([self.ids[s: s + self.seq_len + 1] for s in starts.tolist()])

    def state(self):
        return self.gen.get_state()

    def set_state(self, st):
        self.gen.set_state(st)


def eval_windows(ids: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    n = max(1, min(max_windows, (ids.numel() - 1) // seq_len))
    step = max(seq_len, (ids.numel() - 1 - seq_len) // max(1, n - 1)) if n > 1 else seq_len
    starts = [min(i * step, ids.numel() - seq_len - 1) for i in range(n)]
    return torch.stack([ids[s: s + seq_len + 1] for s in starts])


def lm_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, impl: str, batch: int) -> float:
    model.set_attn_implementation(impl)
    model.eval()
    tot = 0.0
    for i in range(0, windows.shape[0], batch):
        b = windows[i: i + batch]
        tot += lm_loss(model, b).item() * b.shape[0]
    return tot / windows.shape[0]


def _progress(**kw):
    from tqdm.auto import tqdm
    return tqdm(file=sys.stderr, dynamic_ncols=True, **kw)


def train_phase(model, data: Windows, *, steps: int, start: int, lr: float, impl: str, opt, sched, log: dict,
                ckpt, ckpt_every: int, desc: str, key: str, budget: list | None = None) -> bool:
    """Run steps ``start..steps-1``; append to ``log[key]`` (loss) and ``log[key + '_gn']`` (grad norm).

    ``budget``: a one-element list with the steps this invocation may still run (``--stop-after``);
    returns False when it ran out (after checkpointing), True when the phase finished."""
    model.set_attn_implementation(impl)
    model.train()
    bar = _progress(total=steps, initial=start, desc=desc)
    for step in range(start, steps):
        if budget is not None and budget[0] <= 0:
            ckpt(step)
            bar.close()
            return False
        if budget is not None:
            budget[0] -= 1
        loss = lm_loss(model, data.next())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        sched.step()
        log[key].append(loss.item())
        log[key + "_gn"].append(gn)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", gnorm=f"{gn:.2f}")
        if ckpt is not None and ((step + 1) % ckpt_every == 0 or step + 1 == steps):
            ckpt(step + 1)
    bar.close()
    return True


def make_optim(model, lr: float, steps: int):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))))
    return opt, sched


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="?", default=None, help="training text file (default: an embedded text)")
    p.add_argument("--text", dest="text_opt", default=None, help="same as the positional argument")
    p.add_argument("--model", default=None, help="local transformers checkpoint directory (causal LM + tokenizer); "
                   "default: a tiny Llama built from a config")
    p.add_argument("--fmt", choices=("nvfp4", "mxfp4"), default="nvfp4")
    p.add_argument("--steps", type=int, default=200, help="Attn-QAT fine-tune steps")
    p.add_argument("--pretrain-steps", type=int, default=300,
                   help="BF16 pre-training steps of the tiny model from a config (ignored with --model)")
    p.add_argument("--lr", type=float, default=3e-4, help="fine-tune learning rate")
    p.add_argument("--pretrain-lr", type=float, default=3e-3)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--eval-windows", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--resume", action="store_true", help="continue from OUT/qat_ckpt.pt")
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop this invocation after N training steps (checkpointed; continue with --resume)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("fp4attn-out", "qat"))


def _save(path: str, obj) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def run(args) -> int:
    from .integrations.transformers import register

    t0 = time.time()
    text_path = args.text or args.text_opt
    if text_path:
        with open(text_path, encoding="utf-8") as f:
            text = f.read()
    else:
        text = DEFAULT_TEXT
    os.makedirs(args.out, exist_ok=True)
    ckpt_path = os.path.join(args.out, "qat_ckpt.pt")
    model, ids, desc = load_model_and_tokens(args, text)
    n_val = max(args.seq_len + 2, ids.numel() // 10)
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    if train_ids.numel() < args.seq_len + 2:
        train_ids = ids  # tiny texts: evaluate on a slice of the training text (said in the table)
    val = eval_windows(val_ids, min(args.seq_len, val_ids.numel() - 1), args.eval_windows)
    print(f"fp4attn qat: {desc}; {ids.numel()} tokens ({'file ' + text_path if text_path else 'embedded text'}); "
          f"Attn-QAT {args.fmt}, {args.steps} steps", file=sys.stderr)

    qat_impl = register(args.fmt)                    # auto: Attn-QAT in train, FP4 inference in eval
    fp4_impl = register(args.fmt, mode="infer")      # FP4 inference, for evaluation
    log = {"pretrain": [], "pretrain_gn": [], "qat": [], "qat_gn": []}
    state = {"phase": "pretrain", "step": 0, "before": None}
    pre_steps = 0 if args.model else args.pretrain_steps

    resume = args.resume and os.path.exists(ckpt_path)
    if args.resume and not resume:
        print(f"fp4attn qat: --resume but no {ckpt_path}; starting from scratch", file=sys.stderr)
    if resume:
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["args"]["fmt"] != args.fmt or ck["args"]["model"] != args.model:
            print("fp4attn qat: checkpoint was made with other --fmt/--model; refusing to resume", file=sys.stderr)
            return 2
        model.load_state_dict(ck["model"])
        log, state = ck["log"], ck["state"]
        print(f"fp4attn qat: resumed at {state['phase']} step {state['step']}", file=sys.stderr)

    data = Windows(train_ids, args.seq_len, args.batch, args.seed)
    budget = None if args.stop_after is None else [args.stop_after]

    def stopped() -> int:
        print(f"fp4attn qat: stopped after --stop-after {args.stop_after} steps; checkpoint {ckpt_path} "
              "(continue with --resume)", file=sys.stderr)
        return 0

    def checkpointer(phase, opt, sched):
        def save(step):
            state.update(phase=phase, step=step)
            _save(ckpt_path, dict(model=model.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(),
                                  data=data.state(), log=log, state=state, args=vars(args)))
        return save

    # phase 1: BF16 pre-training of the tiny model
    if state["phase"] == "pretrain" and pre_steps > 0:
        opt, sched = make_optim(model, args.pretrain_lr, pre_steps)
        if resume and ck.get("opt") is not None:
            opt.load_state_dict(ck["opt"])
            sched.load_state_dict(ck["sched"])
            data.set_state(ck["data"])
        if not train_phase(model, data, steps=pre_steps, start=state["step"], lr=args.pretrain_lr, impl="sdpa",
                           opt=opt, sched=sched, log=log, ckpt=checkpointer("pretrain", opt, sched),
                           ckpt_every=args.ckpt_every, desc="BF16 pre-training", key="pretrain", budget=budget):
            return stopped()
        resume = False
    if state["phase"] == "pretrain":
        state.update(phase="qat", step=0)

    # evaluation before the fine-tune
    if state["before"] is None:
        state["before"] = {"bf16": evaluate(model, val, "sdpa", args.batch),
                           "fp4": evaluate(model, val, fp4_impl, args.batch)}
    # phase 2: Attn-QAT fine-tune
    opt, sched = make_optim(model, args.lr, args.steps)
    if resume and state["phase"] == "qat" and ck.get("opt") is not None and ck["state"]["phase"] == "qat":
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        data.set_state(ck["data"])
    if state["step"] < args.steps:
        if not train_phase(model, data, steps=args.steps, start=state["step"], lr=args.lr, impl=qat_impl, opt=opt,
                           sched=sched, log=log, ckpt=checkpointer("qat", opt, sched), ckpt_every=args.ckpt_every,
                           desc=f"Attn-QAT ({args.fmt}) fine-tune", key="qat", budget=budget):
            return stopped()
    after = {"bf16": evaluate(model, val, "sdpa", args.batch), "fp4": evaluate(model, val, fp4_impl, args.batch)}
    before = state["before"]
    wall = time.time() - t0

    # report
    gap = before["fp4"] - before["bf16"]
    rec = (before["fp4"] - after["fp4"]) / gap if gap > 1e-9 else float("nan")
    rows = [("before fine-tune", "BF16 attention", before["bf16"]),
            ("before fine-tune", f"{args.fmt} attention (PTQ)", before["fp4"]),
            ("after Attn-QAT", "BF16 attention", after["bf16"]),
            ("after Attn-QAT", f"{args.fmt} attention", after["fp4"])]
    lines = ["| weights | attention | held-out loss | perplexity |", "|---|---|---|---|"]
    lines += [f"| {w} | {a} | {loss:.4f} | {math.exp(min(loss, 50)):.2f} |" for w, a, loss in rows]
    lines.append("")
    lines.append(f"FP4 PTQ loss gap {gap:+.4f} nats; Attn-QAT closes "
                 f"{'—' if rec != rec else f'{100 * rec:.0f}%'} of it "
                 f"(after-QAT {args.fmt} loss vs the starting weights' BF16 loss).")
    lines.append(f"{desc}; {args.steps} Attn-QAT steps, seq {args.seq_len}, batch {args.batch}; "
                 f"wall {wall:.0f} s this invocation")
    text_out = "\n".join(lines)
    print(text_out)
    with open(os.path.join(args.out, "qat_results.md"), "w") as f:
        f.write(text_out + "\n")
    with open(os.path.join(args.out, "qat_results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["weights", "attention", "loss", "perplexity"])
        for r in rows:
            w.writerow([r[0], r[1], f"{r[2]:.6f}", f"{math.exp(min(r[2], 50)):.6f}"])
    with open(os.path.join(args.out, "qat_log.json"), "w") as f:
        json.dump(dict(log=log, before=before, after=after, args=vars(args)), f)
    _plots(args.out, log)
    return 0


def _plots(out: str, log: dict) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNGs (pip install 'fp4attn[plot]')", file=sys.stderr)
        return
    for key, ylabel, fname in (("", "training loss", "qat_loss.png"), ("_gn", "gradient norm (before clipping)",
                                                                        "qat_grad_norm.png")):
        fig, ax = plt.subplots(figsize=(7, 4))
        pre = log["pretrain" + key]
        qat = log["qat" + key]
        if pre:
            ax.plot(range(len(pre)), pre, label="BF16 pre-training")
        ax.plot(range(len(pre), len(pre) + len(qat)), qat, label="Attn-QAT fine-tune")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=120)
        plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fp4attn qat", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
