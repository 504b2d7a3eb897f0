"""``fp4attn qat`` under torchrun: DDP and FSDP2 (``fully_shard``), activation checkpointing, torch.compile.

CPU (CI): two processes over gloo at a tiny setting. The DDP run checks that the ranks trained on
different batches yet end with identical parameters (also those in the checkpoint), that the logged
loss is the mean of the ranks' losses and that it fell. The FSDP2 run is interrupted and resumed
(the optimizer state goes through ``torch.distributed.checkpoint.state_dict``) and must reproduce the
DDP run: the same data-parallel training, sharded instead of replicated.

GPU (``-m gpu``, two or more CUDA devices): DDP and FSDP2 on two GPUs over NCCL, each with
``--activation-checkpointing --compile``.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import fp4attn  # noqa: E402
from fp4attn.qat import _digest  # noqa: E402

TINY = ["--steps", "4", "--pretrain-steps", "3", "--seq-len", "24", "--batch", "2", "--hidden", "32",
        "--layers", "2", "--heads", "2", "--kv-heads", "1", "--eval-windows", "2", "--ckpt-every", "2"]

needs_dist = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not available")


def _torchrun(args, out, nproc=2, timeout=300):
    """Run ``fp4attn qat`` on ``nproc`` processes under torchrun; returns the CompletedProcess."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(fp4attn.__file__)))  # this fp4attn, in every rank
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "fp4attn", "qat", *args, "--out", str(out), "--debug-rank-files"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)}\nexit {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n" \
                              f"--- stderr\n{r.stderr[-8000:]}"
    return r


def _read(out, name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def _check_ranks(out, nproc=2):
    """Per-rank files: same full parameters everywhere (and in the checkpoint), different batches."""
    ranks = [_read(out, f"rank{r}.json") for r in range(nproc)]
    assert [r["rank"] for r in ranks] == list(range(nproc))
    assert all(r["world"] == nproc for r in ranks)
    for r in ranks[1:]:
        assert r["params"] == ranks[0]["params"]  # replicas (DDP) / gathered shards (FSDP2) agree
        assert r["first_batch"] != ranks[0]["first_batch"]  # each rank its own data stream
        assert r["local_losses"] != ranks[0]["local_losses"]
        assert r["after"] == pytest.approx(ranks[0]["after"], rel=1e-6)  # every rank evaluated the same model
    ck = torch.load(os.path.join(out, "qat_ckpt.pt"), weights_only=False, map_location="cpu")
    assert ck["dist"]["world"] == nproc and len(ck["dist"]["data"]) == nproc
    for name, dig in ranks[0]["params"].items():
        assert _digest(ck["model"][name]) == dig, name  # the saved (full, unsharded) state is the trained one
    return ranks, ck


def _check_results(out):
    for name in ("qat_results.md", "qat_results.csv", "qat_log.json", "qat_loss.png", "qat_ckpt.pt"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    md = open(os.path.join(out, "qat_results.md")).read()
    assert "after Attn-QAT" in md and "on 2 processes" in md
    log = _read(out, "qat_log.json")
    losses = log["log"]["pretrain"] + log["log"]["qat"]
    assert losses and all(math.isfinite(v) and 0 < v < 20 for v in losses)
    assert all(math.isfinite(v) and v > 0 for v in log["log"]["pretrain_gn"] + log["log"]["qat_gn"])
    assert all(math.isfinite(v) for v in (*log["before"].values(), *log["after"].values()))
    return log


@pytest.fixture(scope="module")
def ddp_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    _torchrun([*TINY, "--dist", "ddp", "--device", "cpu", "--activation-checkpointing"], out)
    return out


@needs_dist
def test_ddp_cpu_gloo(ddp_cpu):
    out = ddp_cpu
    log = _check_results(out)
    assert "ddp on 2 processes (cpu)" in open(os.path.join(out, "qat_results.md")).read()
    assert len(log["log"]["pretrain"]) == 3 and len(log["log"]["qat"]) == 4
    ranks, ck = _check_ranks(out)
    assert ranks[0]["mode"] == "ddp" and ranks[0]["checkpointed_layers"] == 2
    # the logged loss is the mean over the ranks of their own losses
    mean = [sum(v) / len(v) for v in zip(*(r["local_losses"] for r in ranks))]
    assert log["log"]["pretrain"] + log["log"]["qat"] == pytest.approx(mean, rel=1e-6)
    assert log["log"]["pretrain"][-1] < log["log"]["pretrain"][0]  # it learns
    assert log["after"]["bf16"] < log["before"]["bf16"]
    assert ck["state"] == {"phase": "qat", "step": 4, "before": log["before"]}


@needs_dist
def test_fsdp2_cpu_gloo_interrupted_and_resumed_matches_ddp(ddp_cpu, tmp_path):
    """FSDP2 on gloo (torch >= 2.6), stopped inside the fine-tune and resumed (the sharded optimizer
    state saved as a full state dict and loaded back): the same training as the DDP run."""
    out = tmp_path / "fsdp2"
    args = [*TINY, "--dist", "fsdp2", "--device", "cpu"]
    _torchrun([*args, "--stop-after", "5"], out)  # 3 pre-training + 2 fine-tune steps
    assert not os.path.exists(out / "qat_results.md")
    ck = torch.load(out / "qat_ckpt.pt", weights_only=False, map_location="cpu")
    assert ck["state"]["phase"] == "qat" and ck["state"]["step"] == 2 and ck["opt"]["state"]
    _torchrun([*args, "--resume"], out)
    log = _check_results(out)
    ranks, _ = _check_ranks(out)
    assert ranks[0]["mode"] == "fsdp2" and len(ranks[0]["local_losses"]) == 2  # the resumed invocation's steps
    ref = _read(ddp_cpu, "qat_log.json")
    for key in ("pretrain", "pretrain_gn", "qat", "qat_gn"):
        assert log["log"][key] == pytest.approx(ref["log"][key], rel=1e-4), key
    for k in ("before", "after"):
        assert log[k] == pytest.approx(ref[k], rel=1e-4), k


@needs_dist
def test_dist_needs_torchrun_and_rejects_none_under_launcher(tmp_path, monkeypatch):
    from fp4attn.cli import main
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert main(["qat", *TINY, "--dist", "ddp", "--out", str(tmp_path)]) == 2
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["qat", *TINY, "--dist", "none", "--out", str(tmp_path)]) == 2


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_gpu_two_devices_checkpointing_compile(mode, tmp_path):
    out = tmp_path / mode
    args = ["--steps", "8", "--pretrain-steps", "4", "--seq-len", "128", "--batch", "4", "--hidden", "128",
            "--layers", "2", "--heads", "4", "--kv-heads", "2", "--eval-windows", "8", "--ckpt-every", "4",
            "--pretrain-lr", "3e-3", "--lr", "1e-3", "--dist", mode, "--activation-checkpointing", "--compile"]
    _torchrun(args, out, timeout=600)
    log = _check_results(out)
    assert f"{mode} on 2 processes (cuda)" in open(out / "qat_results.md").read()
    ranks, _ = _check_ranks(out)
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    assert all(r["compiled"] and r["checkpointed_layers"] == 2 for r in ranks)
    assert len(log["log"]["qat"]) == 8
    assert min(log["log"]["pretrain"] + log["log"]["qat"]) < log["log"]["pretrain"][0]
