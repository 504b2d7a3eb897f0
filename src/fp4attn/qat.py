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

Under ``torchrun`` (``WORLD_SIZE`` > 1) it trains data-parallel: ``--dist ddp`` (the default there)
or ``--dist fsdp2`` (``fully_shard`` on each decoder layer, then the root), each rank on its own
stream of training windows (``--batch`` is per rank), on ``cuda:LOCAL_RANK`` with NCCL when CUDA is
present, else on the CPU with gloo; ``--activation-checkpointing`` and ``--compile`` work with
either. Evaluation runs on every rank (FSDP2 needs all of them); printing, checkpoints, tables and
plots come from rank 0 only.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
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
    # use_cache=False: no KV cache is built for a training / evaluation forward (same logits)
    logits = model(batch[:, :-1], use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, impl: str, batch: int, device=None, eager: bool = False) -> float:
    """Mean held-out loss. ``eager``: run torch.compile'd layers eagerly (no recompiles for eval modes)."""
    import contextlib
    model.set_attn_implementation(impl)
    model.eval()
    tot = 0.0
    with torch.compiler.set_stance("force_eager") if eager else contextlib.nullcontext():
        for i in range(0, windows.shape[0], batch):
            b = windows[i: i + batch]
            if device is not None:
                b = b.to(device)
            tot += lm_loss(model, b).item() * b.shape[0]
    return tot / windows.shape[0]


def _progress(**kw):
    from tqdm.auto import tqdm
    return tqdm(file=sys.stderr, dynamic_ncols=True, **kw)


def train_phase(model, data: Windows, *, steps: int, start: int, lr: float, impl: str, opt, sched, log: dict,
                ckpt, ckpt_every: int, desc: str, key: str, budget: list | None = None, dist=None) -> bool:
    """Run steps ``start..steps-1``; append to ``log[key]`` (loss) and ``log[key + '_gn']`` (grad norm).

    ``budget``: a one-element list with the steps this invocation may still run (``--stop-after``);
    returns False when it ran out (after checkpointing), True when the phase finished.
    ``dist``: a :class:`_Dist` when running under torchrun: the forward goes through its wrapper
    (DDP) on its device, the logged loss is the mean over ranks, only rank 0 shows progress."""
    model.set_attn_implementation(impl)
    model.train()
    fwd = model if dist is None else dist.wrapped
    bar = _progress(total=steps, initial=start, desc=desc, disable=dist is not None and not dist.main)
    for step in range(start, steps):
        if budget is not None and budget[0] <= 0:
            ckpt(step)
            bar.close()
            return False
        if budget is not None:
            budget[0] -= 1
        batch = data.next()
        if dist is not None:
            dist.note_batch(batch)
            batch = batch.to(dist.device)
        loss = lm_loss(fwd, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if dist is None:
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        else:
            gn = dist.clip_grad_norm(model, 1.0)
        opt.step()
        sched.step()
        lv = loss.item() if dist is None else dist.mean_loss(loss)
        log[key].append(lv)
        log[key + "_gn"].append(gn)
        bar.update(1)
        bar.set_postfix(loss=f"{lv:.3f}", gnorm=f"{gn:.2f}")
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
# one process or one rank of a torchrun job: DDP / FSDP2, activation checkpointing, torch.compile
# ------------------------------------------------------------------------------------------------
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def _clean_name(name: str) -> str:
    """A parameter name without the prefixes activation checkpointing / compile wrappers add."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def _digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:32]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a transformers model, outermost first: instances of its
    ``_no_split_modules`` classes, else its ``GradientCheckpointingLayer`` modules."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [(n, m) for n, m in model.named_modules() if n and type(m).__name__ in names]
    if not found:
        try:
            from transformers.modeling_layers import GradientCheckpointingLayer
        except ImportError:  # pragma: no cover - depends on the transformers version
            GradientCheckpointingLayer = ()
        found = [(n, m) for n, m in model.named_modules() if n and isinstance(m, GradientCheckpointingLayer)]
    outer = [(n, m) for n, m in found if not any(n.startswith(o + ".") for o, _ in found)]
    if not outer:
        raise ValueError(f"fp4attn qat: cannot find the decoder layers of {type(model).__name__} "
                         "(no _no_split_modules / GradientCheckpointingLayer modules)")
    return [m for _, m in outer]


def _checkpoint_layers(model: torch.nn.Module, layers: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Replace each layer by a non-reentrant ``checkpoint_wrapper`` of it (its activations are
    recomputed in the backward); returns the wrappers. State-dict names are unchanged (the wrapper's
    hooks strip its prefix; ``torch.distributed.checkpoint.state_dict`` does too)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    targets = {id(m) for m in layers}
    wrapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                w = checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
                setattr(parent, name, w)
                wrapped.append(w)
    return wrapped


class _Dist:
    """Where ``fp4attn qat`` runs: one process (``mode="none"``, the model on ``device``, by default the
    CPU) or one rank of a torchrun job (``"ddp"`` / ``"fsdp2"``). Holds the module the training forward
    goes through (``wrapped``) and the few collective operations the command needs."""

    def __init__(self, mode: str = "none", rank: int = 0, world: int = 1, device=None):
        self.mode, self.rank, self.world = mode, rank, world
        self.device = torch.device("cpu") if device is None else device
        self.wrapped = None
        self.compiled = False
        self.checkpointed = 0         # decoder layers wrapped for activation checkpointing
        self.mesh = None
        self.first_batch = None       # digest of this rank's first training batch (--debug-rank-files)
        self.local_losses = []        # this rank's own losses (the log has the mean over ranks)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.mode != "none"

    def log(self, msg: str) -> None:
        if self.main:
            print(msg, file=sys.stderr)

    # -- setup / teardown --------------------------------------------------------------------------
    @classmethod
    def from_args(cls, args):
        """A :class:`_Dist` for ``args`` (the process group initialized), or an exit status."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        mode = args.dist if args.dist != "auto" else ("ddp" if world > 1 else "none")
        if mode == "none" and world > 1:
            print(f"fp4attn qat: --dist none under a launcher with WORLD_SIZE={world}: every process would run the "
                  "whole job and write the same files; use --dist ddp / fsdp2, or start one process", file=sys.stderr)
            return 2
        if mode != "none" and not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            print(f"fp4attn qat: --dist {mode} needs the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, "
                  f"MASTER_PORT): torchrun --nproc_per_node=N -m fp4attn qat ... --dist {mode}", file=sys.stderr)
            return 2
        want = args.device
        if want == "auto":
            want = "cuda" if mode != "none" and torch.cuda.is_available() else "cpu"
        if want == "cuda":
            if not torch.cuda.is_available():
                print("fp4attn qat: --device cuda but CUDA is not available", file=sys.stderr)
                return 2
            if local_rank >= torch.cuda.device_count():
                print(f"fp4attn qat: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices",
                      file=sys.stderr)
                return 2
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        ctx = cls(mode, rank if mode != "none" else 0, world if mode != "none" else 1, device)
        if ctx.on:
            import torch.distributed as dist
            if device.type == "cuda":
                dist.init_process_group("nccl", device_id=device)
            else:
                dist.init_process_group("gloo")
            if mode == "fsdp2":
                from torch.distributed.device_mesh import init_device_mesh
                ctx.mesh = init_device_mesh(device.type, (world,))
        return ctx

    def close(self, synchronize: bool = True) -> None:
        """Tear the process group down. After a successful run every rank first waits at a barrier for the
        others (rank 0 writes the report and checkpoints), so no rank tears its group down under a peer's
        last collective. After an error the barrier is skipped (a peer may never reach it). The worker
        then leaves through :func:`_exit_worker`."""
        if self.on:
            import torch.distributed as dist
            if dist.is_initialized():
                if synchronize:
                    dist.barrier()
                dist.destroy_process_group()

    def wrap(self, model: torch.nn.Module, activation_checkpointing: bool = False, compile: bool = False):
        """Move the model to the device; checkpoint, shard (FSDP2) or replicate (DDP), then compile its
        decoder layers. The model object stays the one to call for evaluation and state dicts."""
        model.to(self.device)
        if not (activation_checkpointing or compile or self.mode == "fsdp2"):
            layers = []
        else:
            layers = decoder_layers(model)
        if activation_checkpointing:
            layers = _checkpoint_layers(model, layers)
            self.checkpointed = len(layers)
        if self.mode == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            for layer in layers:
                fully_shard(layer, mesh=self.mesh)
            fully_shard(model, mesh=self.mesh)
            self.wrapped = model
        elif self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            self.wrapped = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        else:
            self.wrapped = model
        if compile:
            # each decoder layer, in place (names unchanged), after DDP / fully_shard; masks, embeddings and the
            # loss stay eager. Evaluation runs the layers eagerly (evaluate(eager=True)): no recompiles for it.
            if self.mode == "ddp":
                # no DDPOptimizer (it splits a graph at DDP's bucket boundaries; the per-layer graphs are small
                # already, and some torch releases reject graphs holding the activation-checkpoint operator)
                torch._dynamo.config.optimize_ddp = False
            for layer in layers:
                layer.compile()
            self.compiled = True
        return self.wrapped

    def reshard(self, model: torch.nn.Module) -> None:
        """FSDP2: free the gathered parameters an evaluation forward left (the root keeps them after a
        forward until a backward), so that ``model.parameters()`` are the sharded ones again."""
        if self.mode == "fsdp2":
            from torch.distributed.fsdp import FSDPModule
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()

    # -- per step ----------------------------------------------------------------------------------
    def note_batch(self, batch: torch.Tensor) -> None:
        if self.first_batch is None:
            self.first_batch = _digest(batch)

    def mean_loss(self, loss: torch.Tensor) -> float:
        v = loss.item()
        self.local_losses.append(v)
        if not self.on:
            return v
        import torch.distributed as dist
        t = loss.detach().float().reshape(1).clone()
        dist.all_reduce(t)
        return t.item() / self.world

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        if self.mode != "fsdp2":
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
        # FSDP2: the gradients are sharded DTensors; the norm of the whole gradient needs a reduction
        params = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        if hasattr(total, "full_tensor"):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total.item()

    def gather(self, obj) -> list:
        if not self.on:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    # -- state dicts (full, unsharded; collective under FSDP2: every rank calls) --------------------
    def model_state(self, model: torch.nn.Module) -> dict:
        if self.mode == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        sd = model.state_dict()
        return sd if self.device.type == "cpu" else {k: v.detach().cpu() for k, v in sd.items()}

    def optim_state(self, model: torch.nn.Module, opt):
        if self.mode == "fsdp2":
            if not opt.state:  # not stepped yet; get_optimizer_state_dict would initialize it by a zero step
                return None
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
            return get_optimizer_state_dict(model, opt,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return opt.state_dict()

    def load_optim(self, model: torch.nn.Module, opt, sd) -> None:
        if self.mode == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            set_optimizer_state_dict(model, opt, sd, options=StateDictOptions(full_state_dict=True))
        else:
            opt.load_state_dict(sd)

    def param_digests(self, model: torch.nn.Module) -> dict:
        """{name: digest} of the full parameters (FSDP2: gathered; collective)."""
        out = {}
        for name, p in model.named_parameters():
            t = p.detach()
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            out[_clean_name(name)] = _digest(t)
        return out


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
# the arguments a --resume must repeat (the model, the data order, the schedules)
RESUME_SAME = ("fmt", "model", "text", "text_opt", "hidden", "layers", "heads", "kv_heads", "seq_len", "batch", "seed",
               "steps", "pretrain_steps", "lr", "pretrain_lr")


def _int_at_least(lo: int):
    """argparse type: an int >= lo (a bad value is a usage error at once, not a crash after pre-training)."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an int >= {lo}, got {v}")
        return v
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="?", default=None, help="training text file (default: an embedded text)")
    p.add_argument("--text", dest="text_opt", default=None, help="same as the positional argument")
    p.add_argument("--model", default=None, help="local transformers checkpoint directory (causal LM + tokenizer); "
                   "default: a tiny Llama built from a config")
    p.add_argument("--fmt", choices=("nvfp4", "mxfp4"), default="nvfp4")
    p.add_argument("--steps", type=_int_at_least(1), default=200, help="Attn-QAT fine-tune steps")
    p.add_argument("--pretrain-steps", type=_int_at_least(0), default=300,
                   help="BF16 pre-training steps of the tiny model from a config (ignored with --model)")
    p.add_argument("--lr", type=float, default=3e-4, help="fine-tune learning rate")
    p.add_argument("--pretrain-lr", type=float, default=3e-3)
    p.add_argument("--seq-len", type=_int_at_least(1), default=128)
    p.add_argument("--batch", type=_int_at_least(1), default=8)
    p.add_argument("--eval-windows", type=_int_at_least(1), default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ckpt-every", type=_int_at_least(1), default=50)
    p.add_argument("--resume", action="store_true", help="continue from OUT/qat_ckpt.pt")
    p.add_argument("--stop-after", type=_int_at_least(1), default=None,
                   help="stop this invocation after N training steps (checkpointed; continue with --resume)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("fp4attn-out", "qat"))
    g = p.add_argument_group("several GPUs / processes (launch with torchrun)")
    g.add_argument("--dist", choices=("auto", "ddp", "fsdp2", "none"), default="auto",
                   help="data parallelism: DDP, or FSDP2 (fully_shard on each decoder layer, then the root); "
                   "auto: ddp when WORLD_SIZE > 1, else none. --batch is per process")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda:LOCAL_RANK under --dist ddp/fsdp2 when CUDA is present (NCCL), else the CPU "
                   "(gloo); a single process runs on the CPU unless --device cuda")
    g.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder layer's activations in the backward (non-reentrant checkpoint)")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile each decoder layer for training (after DDP / fully_shard)")
    g.add_argument("--debug-rank-files", action="store_true",
                   help="every rank writes OUT/rank<R>.json: digests of its full parameters and first batch, "
                   "its own losses (for tests)")


def _save(path: str, obj) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def run(args) -> int:
    ctx = _Dist.from_args(args)
    if isinstance(ctx, int):
        return ctx
    ok = False
    try:
        rc = _run(args, ctx)
        ok = True
    finally:
        ctx.close(synchronize=ok)
    if ctx.on:
        _exit_worker(rc)
    return rc


def _exit_worker(rc: int) -> None:
    """End a torchrun worker without interpreter finalization (``os._exit`` after flushing).

    A gloo worker thread may still be dropping a finished collective's work object, which owns tensors
    with Python objects, after ``destroy_process_group`` and a final barrier have returned; the GIL it
    then takes while the interpreter finalizes kills the thread inside a destructor: ``terminate called
    without an active exception``, SIGABRT, a failed torchrun (pytorch/pytorch#190489; about one
    ``--stop-after`` run in ten on a loaded 2-core CPU machine, the core dump showing exactly that stack).
    Every file of the run is closed by now, so skipping finalization loses nothing."""
    import logging
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _run(args, ctx: _Dist) -> int:
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
    where = "" if not ctx.on else f"; {ctx.mode} on {ctx.world} processes ({ctx.device.type}), batch {args.batch} " \
        "per process"
    ctx.log(f"fp4attn qat: {desc}; {ids.numel()} tokens ({'file ' + text_path if text_path else 'embedded text'}); "
            f"Attn-QAT {args.fmt}, {args.steps} steps{where}")

    qat_impl = register(args.fmt)                    # auto: Attn-QAT in train, FP4 inference in eval
    fp4_impl = register(args.fmt, mode="infer")      # FP4 inference, for evaluation
    log = {"pretrain": [], "pretrain_gn": [], "qat": [], "qat_gn": []}
    state = {"phase": "pretrain", "step": 0, "before": None}
    pre_steps = 0 if args.model else args.pretrain_steps
    layout = None if not ctx.on else dict(mode=ctx.mode, world=ctx.world)

    resume = args.resume and os.path.exists(ckpt_path)
    if args.resume and not resume:
        ctx.log(f"fp4attn qat: --resume but no {ckpt_path}; starting from scratch")
    if resume:
        ck = torch.load(ckpt_path, weights_only=False, **({} if not ctx.on else {"map_location": "cpu"}))
        # what the model, its data order and its schedules depend on: a resumed run must be the same run
        differ = [k for k in RESUME_SAME if ck["args"].get(k, getattr(args, k)) != getattr(args, k)]
        if differ:
            opts = ", ".join(f"--{k.replace('_', '-')} {ck['args'][k]!r} (now {getattr(args, k)!r})" for k in differ)
            ctx.log(f"fp4attn qat: the checkpoint was made with {opts}; refusing to resume (pass the same values, or "
                    "another --out)")
            return 2
        made = ck.get("dist")
        if (None if made is None else dict(mode=made["mode"], world=made["world"])) != layout:
            how = "one process" if made is None else f"--dist {made['mode']} on {made['world']} processes"
            ctx.log(f"fp4attn qat: checkpoint was made with {how}; resume it the same way")
            return 2
        model.load_state_dict(ck["model"])  # the full state dict, before wrapping / sharding
        log, state = ck["log"], ck["state"]
        ctx.log(f"fp4attn qat: resumed at {state['phase']} step {state['step']}")

    # every rank its own stream of training windows (rank 0: the single-process stream)
    data = Windows(train_ids, args.seq_len, args.batch, args.seed + 1_000_003 * ctx.rank)
    budget = None if args.stop_after is None else [args.stop_after]
    ctx.wrap(model, activation_checkpointing=args.activation_checkpointing, compile=args.compile)
    dev = None if ctx.device.type == "cpu" else ctx.device

    def stopped() -> int:
        ctx.log(f"fp4attn qat: stopped after --stop-after {args.stop_after} steps; checkpoint {ckpt_path} "
                "(continue with --resume)")
        return 0

    def checkpointer(phase, opt, sched):
        def save(step):
            state.update(phase=phase, step=step)
            model_sd, opt_sd = ctx.model_state(model), ctx.optim_state(model, opt)  # collective under FSDP2
            extra = {}
            if ctx.on:
                extra["dist"] = dict(layout, data=ctx.gather(data.state()))
                if opt_sd is None:
                    extra["opt_fresh"] = True
            if ctx.main:
                _save(ckpt_path, dict(model=model_sd, opt=opt_sd, sched=sched.state_dict(), data=data.state(),
                                      log=log, state=state, args=vars(args), **extra))
        return save

    def restore(opt, sched):
        """The optimizer, schedule and data-stream state of the checkpoint."""
        if ck.get("opt") is None and not ck.get("opt_fresh"):
            return
        if ck.get("opt") is not None:
            ctx.load_optim(model, opt, ck["opt"])
        sched.load_state_dict(ck["sched"])
        data.set_state(ck["data"] if not ctx.on else ck["dist"]["data"][ctx.rank])

    # phase 1: BF16 pre-training of the tiny model
    if state["phase"] == "pretrain" and pre_steps > 0:
        opt, sched = make_optim(model, args.pretrain_lr, pre_steps)
        if resume:
            restore(opt, sched)
        if not train_phase(model, data, steps=pre_steps, start=state["step"], lr=args.pretrain_lr, impl="sdpa",
                           opt=opt, sched=sched, log=log, ckpt=checkpointer("pretrain", opt, sched),
                           ckpt_every=args.ckpt_every, desc="BF16 pre-training", key="pretrain", budget=budget,
                           dist=ctx):
            return stopped()
        resume = False
    if state["phase"] == "pretrain":
        state.update(phase="qat", step=0)

    # evaluation before the fine-tune (every rank: FSDP2 gathers the parameters collectively)
    if state["before"] is None:
        state["before"] = {"bf16": evaluate(model, val, "sdpa", args.batch, dev, ctx.compiled),
                           "fp4": evaluate(model, val, fp4_impl, args.batch, dev, ctx.compiled)}
        ctx.reshard(model)
    # phase 2: Attn-QAT fine-tune
    opt, sched = make_optim(model, args.lr, args.steps)
    if resume and state["phase"] == "qat" and ck["state"]["phase"] == "qat":
        restore(opt, sched)
    if state["step"] < args.steps:
        if not train_phase(model, data, steps=args.steps, start=state["step"], lr=args.lr, impl=qat_impl, opt=opt,
                           sched=sched, log=log, ckpt=checkpointer("qat", opt, sched), ckpt_every=args.ckpt_every,
                           desc=f"Attn-QAT ({args.fmt}) fine-tune", key="qat", budget=budget, dist=ctx):
            return stopped()
    after = {"bf16": evaluate(model, val, "sdpa", args.batch, dev, ctx.compiled),
             "fp4": evaluate(model, val, fp4_impl, args.batch, dev, ctx.compiled)}
    ctx.reshard(model)
    if args.debug_rank_files:
        digests = ctx.param_digests(model)  # collective under FSDP2
        with open(os.path.join(args.out, f"rank{ctx.rank}.json"), "w") as f:
            json.dump(dict(rank=ctx.rank, world=ctx.world, mode=ctx.mode, device=str(ctx.device),
                           compiled=ctx.compiled, checkpointed_layers=ctx.checkpointed, params=digests,
                           first_batch=ctx.first_batch, local_losses=ctx.local_losses, after=after), f)
    if not ctx.main:
        return 0
    before = state["before"]
    wall = time.time() - t0

    # report
    gap = before["fp4"] - before["bf16"]
    # (below 0.01 nats the gap is within the evaluation's noise and its share would be noise: not printed)
    rec = (before["fp4"] - after["fp4"]) / gap if gap > 0.01 else float("nan")
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
    if train_ids is ids:
        lines.append("The text is too short for a held-out part: these losses are on windows of the training text.")
    lines.append(f"{desc}; {args.steps} Attn-QAT steps, seq {args.seq_len}, batch {args.batch}"
                 + (f" per process, {ctx.mode} on {ctx.world} processes ({ctx.device.type})" if ctx.on else "")
                 + f"; wall {wall:.0f} s this invocation")
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
