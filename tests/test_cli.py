"""CLI smoke tests (``fp4attn accuracy`` / ``env`` / ``bench``), metrics and synthetic inputs."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
import types

import pytest
import torch

from fp4attn import accuracy, envinfo, metrics, synthetic
from fp4attn.cli import SUBCOMMANDS, _defines_main, _installed, bench_names, main

TINY = ["--batch", "1", "--heads", "2", "--seq", "128", "--dim", "64", "--no-progress"]


# ----------------------------------------------------------------------------------------- metrics
def test_metrics_known_values():
    o = torch.tensor([1.0, 2.0, 3.0])
    r = torch.tensor([1.0, 2.0, 4.0])
    assert metrics.cossim(o, r) == pytest.approx(17 / math.sqrt(14 * 21), rel=1e-15)
    assert metrics.rel_l1(o, r) == pytest.approx(1 / 7, rel=1e-15)
    assert metrics.rmse(o, r) == pytest.approx(math.sqrt(1 / 3), rel=1e-15)
    assert metrics.rel_l2(o, r) == pytest.approx(1 / math.sqrt(21), rel=1e-15)
    assert metrics.all_metrics(o, r) == {"cossim": metrics.cossim(o, r), "rel_l1": metrics.rel_l1(o, r),
                                         "rmse": metrics.rmse(o, r), "rel_l2": metrics.rel_l2(o, r)}


def test_metrics_identical_orthogonal_opposite_and_shapes():
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    assert metrics.cossim(x, x) == pytest.approx(1.0, abs=1e-15)
    assert metrics.rel_l1(x, x) == 0.0 and metrics.rmse(x, x) == 0.0 and metrics.rel_l2(x, x) == 0.0
    assert metrics.cossim(-x, x) == pytest.approx(-1.0, abs=1e-15)
    assert metrics.rel_l1(-x, x) == pytest.approx(2.0)
    assert metrics.cossim(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == 0.0
    # flattened: the layout does not matter
    xt = x.transpose(0, 2).reshape(-1)
    assert metrics.rel_l1(xt * 1.5, xt) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape"):
        metrics.cossim(x, x[0])
    assert metrics.rel_l1(torch.zeros(4), torch.zeros(4)) == 0.0
    assert metrics.cossim(torch.zeros(4), torch.zeros(4)) == 1.0
    assert metrics.rel_l2(torch.ones(4), torch.zeros(4)) == math.inf
    assert math.isnan(metrics.cossim(torch.tensor([float("nan"), 1.0]), torch.ones(2)))


def test_metrics_compute_in_float64():
    # 1 + 1e-9 is not representable in float32: the error must come from the float64 inputs exactly
    r = torch.ones(1000, dtype=torch.float64)
    o = r + 1e-9
    assert metrics.rel_l1(o, r) == pytest.approx(1e-9, rel=1e-6)
    assert metrics.rmse(o, r) == pytest.approx(1e-9, rel=1e-6)
    # low-precision inputs are accepted (upcast, not computed in bf16)
    assert metrics.rel_l2(o.bfloat16(), r.bfloat16()) == 0.0


# --------------------------------------------------------------------------------------- synthetic
@pytest.mark.parametrize("kind", synthetic.KINDS)
def test_synthetic_shapes_dtype_determinism(kind):
    q, k, v = synthetic.make_inputs(kind, 2, 3, 40, 32, seed=7, dtype=torch.bfloat16)
    for t in (q, k, v):
        assert t.shape == (2, 3, 40, 32) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
        assert torch.isfinite(t.float()).all()
    q2, k2, v2 = synthetic.make_inputs(kind, 2, 3, 40, 32, seed=7, dtype=torch.bfloat16)
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)
    q3, _, _ = synthetic.make_inputs(kind, 2, 3, 40, 32, seed=8, dtype=torch.bfloat16)
    assert not torch.equal(q, q3)
    # the float32 draw is the same numbers before the cast
    q32, _, _ = synthetic.make_inputs(kind, 2, 3, 40, 32, seed=7)
    assert torch.equal(q32.bfloat16(), q)


def test_synthetic_kinds_differ_and_errors():
    qs = [synthetic.make_inputs(kind, 1, 1, 16, 16, seed=0)[0] for kind in synthetic.KINDS]
    for i in range(len(qs)):
        for j in range(i + 1, len(qs)):
            assert not torch.equal(qs[i], qs[j])
    with pytest.raises(ValueError, match="kind"):
        synthetic.make_inputs("nope", 1, 1, 16, 16)
    with pytest.raises(ValueError, match="N"):
        synthetic.make_inputs("gaussian", 1, 1, 0, 16)
    with pytest.raises(TypeError, match="dtype"):
        synthetic.make_inputs("gaussian", 1, 1, 16, 16, dtype=torch.int32)


def _softmax64(q, k):
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.softmax(-1)


def test_gaussian_is_standard_normal():
    q, k, v = synthetic.make_inputs("gaussian", 1, 4, 512, 64, seed=0)
    for t in (q, k, v):
        assert abs(t.mean().item()) < 0.02 and abs(t.std().item() - 1) < 0.02


def test_key_bias_structure():
    q, k, v = synthetic.make_inputs("key_bias", 1, 4, 512, 64, seed=0)
    chan_mean = k.mean(dim=2)  # (B, H, D): the bias
    within = (k - k.mean(dim=2, keepdim=True)).std()
    assert within.item() == pytest.approx(1.0, abs=0.05)
    assert chan_mean.std().item() > 4.0  # a bias several times the token-to-token spread
    assert q.mean(dim=2).abs().max().item() < 0.3  # Q and V unbiased
    assert v.mean(dim=2).abs().max().item() < 0.3
    # the bias does not change exact attention (softmax shift invariance)
    p1 = _softmax64(q, k)
    p2 = _softmax64(q, k - k.mean(dim=2, keepdim=True))
    assert torch.allclose(p1, p2, atol=1e-9, rtol=1e-7)


def test_outliers_structure():
    D = 128
    q, k, v = synthetic.make_inputs("outliers", 1, 3, 512, D, seed=0)
    n_out = synthetic.outlier_channels(D)
    assert n_out == 4
    for h in range(3):
        rq = q[0, h].pow(2).mean(0).sqrt()  # per-channel RMS
        rk = k[0, h].pow(2).mean(0).sqrt()
        top_q = set(rq.topk(n_out).indices.tolist())
        top_k = set(rk.topk(n_out).indices.tolist())
        assert top_q == top_k  # Q and K share the outlier channels
        normal = torch.tensor([c for c in range(D) if c not in top_q])
        assert rq[normal].max().item() < 1.3 and rk[normal].max().item() < 1.3
        assert rq[list(top_q)].min().item() > 2.5 and rk[list(top_k)].min().item() > 2.5
        # heavy tails: the largest outlier value is far beyond anything a normal channel reaches
        assert q[0, h][:, list(top_q)].abs().max().item() > 15
        assert q[0, h][:, normal].abs().max().item() < 6


def test_sinks_structure():
    N = 512
    q, k, v = synthetic.make_inputs("sinks", 1, 4, N, 64, seed=0)
    sinks = synthetic.sink_positions(N)
    assert sinks == [0, 1, 2, 3]
    p = _softmax64(q, k)  # (1, 4, N, N)
    col = p.mean(dim=2)  # mean attention each key receives, per head
    for h in range(4):
        # the sink keys are exactly the keys receiving the most attention, by a wide margin
        assert set(col[0, h].topk(len(sinks)).indices.tolist()) == set(sinks)
        assert col[0, h, sinks].min() > 10 * col[0, h, len(sinks):].max()
    assert (p.argmax(-1) < len(sinks)).double().mean().item() > 0.6  # most rows peak on a sink
    assert p[..., sinks].sum(-1).mean().item() > 0.4  # sinks take a large share of the mass
    # local peaks: keys within 2 positions of the query get far more than a uniform share
    i = torch.arange(N)
    near = ((i[:, None] - i[None, :]).abs() <= 2) & (i[None, :] >= len(sinks))
    per_key_near = (p * near).sum(-1) / near.sum(-1)
    far = ~near & (i[None, :] >= len(sinks))
    per_key_far = (p * far).sum(-1) / far.sum(-1)
    ratio = (per_key_near / per_key_far)[..., len(sinks) + 2:]  # rows with non-sink neighbours
    assert ratio.median().item() > 10  # ~21 here; ~0.9 for gaussian inputs
    # ... and gaussian inputs have neither
    qg, kg, _ = synthetic.make_inputs("gaussian", 1, 4, N, 64, seed=0)
    pg = _softmax64(qg, kg)
    assert pg[..., sinks].sum(-1).mean().item() < 0.05


# ------------------------------------------------------------------------------------- accuracy
def test_exact_attention_matches_sdpa_float64():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 37, 16, generator=g)
    k = torch.randn(2, 2, 53, 16, generator=g)
    v = torch.randn(2, 2, 53, 16, generator=g)
    for causal in (False, True):
        out = accuracy.exact_attention(q, k, v, causal=causal, max_chunk_elems=500)  # several chunks
        kk = k.double().repeat_interleave(2, dim=1)
        vv = v.double().repeat_interleave(2, dim=1)
        mask = None
        if causal:  # bottom-right: query i sees keys j <= i + Nk - Nq
            mask = torch.arange(53)[None, :] <= torch.arange(37)[:, None] + 16
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), kk, vv, attn_mask=mask)
        assert out.dtype == torch.float64
        assert torch.allclose(out, ref, atol=1e-12, rtol=1e-10)


def test_run_accuracy_rows_and_sanity():
    rows = accuracy.run_accuracy(kinds=["gaussian", "key_bias"], recipes=["nvfp4", "bf16", "nvfp4+smoothing"],
                                 heads=2, seq=128, dim=64, seed=0, device="cpu")
    assert [(r["kind"], r["recipe"]) for r in rows] == [
        (k, r) for k in ("gaussian", "key_bias") for r in ("nvfp4", "bf16", "nvfp4+smoothing")]
    by = {(r["kind"], r["recipe"]): r for r in rows}
    for r in rows:
        assert set(r) == {"kind", "recipe", "cossim", "rel_l1", "rmse", "rel_l2", "seconds"}
    # bf16 runs the same code path unquantized: it must agree with our float64 exact attention
    assert by[("gaussian", "bf16")]["rel_l2"] < 1e-5
    # NVFP4 on N(0,1) inputs: SPEC §6 quotes ~0.19 relative L2 against unquantized attention
    assert 0.1 < by[("gaussian", "nvfp4")]["rel_l2"] < 0.3
    # smoothing K removes the per-channel bias that ruins plain NVFP4 (the point of key_bias)
    assert by[("key_bias", "nvfp4+smoothing")]["rel_l2"] < 0.6 * by[("key_bias", "nvfp4")]["rel_l2"]
    assert accuracy.run_accuracy(kinds="gaussian", heads=1, seq=32, dim=16)[0]["recipe"] == "nvfp4"
    n_default = len(accuracy.run_accuracy(kinds="gaussian", heads=1, seq=32, dim=16))
    assert n_default == len(accuracy.DEFAULT_RECIPES)
    with pytest.raises(ValueError, match="recipe"):
        accuracy.run_accuracy(recipes=["fp2"])


def _row(kind, recipe, cs, l1, rmse):
    return {"kind": kind, "recipe": recipe, "cossim": cs, "rel_l1": l1, "rmse": rmse, "rel_l2": l1}


def test_check_orderings_logic():
    rows = [_row("a", "nvfp4", 0.99, 0.10, 0.2), _row("a", "mxfp4", 0.98, 0.20, 0.3),
            _row("a", "nvfp4+two-level P", 0.991, 0.099, 0.199),
            _row("b", "nvfp4", 0.99, 0.10, 0.2), _row("b", "mxfp4", 0.995, 0.05, 0.1),
            _row("b", "nvfp4+two-level P", 0.995, 0.11, 0.1)]
    checks = {(c["kind"], c["claim"]): c for c in accuracy.check_orderings(rows)}
    assert checks[("a", "a")]["holds"] and checks[("a", "a")]["message"].startswith("holds (")
    assert checks[("a", "b")]["holds"] and "small margin" in checks[("a", "b")]["message"]
    assert not checks[("b", "a")]["holds"]
    assert checks[("b", "a")]["message"].startswith("does NOT hold on these inputs (")
    assert "0.99000 vs 0.99500" in checks[("b", "a")]["message"]
    mixed = checks[("b", "b")]  # better CosSim and RMSE, worse L1: not "holds"
    assert not mixed["holds"] and mixed["metrics_holding"] == ["cossim", "rmse"]
    assert "better only on CosSim, RMSE" in mixed["message"]
    # a claim whose recipes were not both run is skipped
    assert accuracy.check_orderings([_row("a", "nvfp4", 1, 0, 0)]) == []


def test_cli_accuracy_tiny(tmp_path, capsys):
    rc = main(["accuracy", *TINY, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| input | recipe | CosSim | Rel. L1 | RMSE | Rel. L2 |" in out
    for kind in synthetic.KINDS:
        for recipe in accuracy.DEFAULT_RECIPES:
            assert f"| {kind} | {recipe} |" in out
        assert f"- {kind}: (a) NVFP4 better than MXFP4" in out
        assert f"- {kind}: (b) two-level P better than direct" in out
    assert out.count("holds") >= 2 * len(synthetic.KINDS)
    with open(tmp_path / "accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(synthetic.KINDS) * len(accuracy.DEFAULT_RECIPES)
    assert set(rows[0]) == {"kind", "recipe", "cossim", "rel_l1", "rmse", "rel_l2", "seconds"}
    assert all(0.5 < float(r["cossim"]) <= 1.0 for r in rows)
    png = (tmp_path / "accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_cli_accuracy_options(tmp_path, capsys):
    rc = main(["accuracy", *TINY, "--out", str(tmp_path), "--no-plot", "--kinds", "sinks",
               "--recipes", "nvfp4,bf16", "--causal", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and "| sinks | bf16 |" in out and "gaussian" not in out and "causal" in out
    assert (tmp_path / "accuracy.csv").exists() and not (tmp_path / "accuracy.png").exists()
    assert main(["accuracy", *TINY, "--out", str(tmp_path), "--kinds", "nope"]) == 2
    assert "unknown input kind" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- env, bench
def test_cli_env(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert f"- torch: {torch.__version__}" in out and "- triton:" in out and "CUDA available" in out
    for op in envinfo.OPS:
        assert f"| {op} |" in out
    if not torch.cuda.is_available():
        assert out.count(envinfo.REFERENCE) >= len(envinfo.OPS)
    assert main(["env", "--json"]) == 0
    assert '"paths"' in capsys.readouterr().out


def test_env_path_rules():
    op = "attention recipe=nvfp4"
    assert envinfo.path_for(op, None) == envinfo.REFERENCE
    assert envinfo.path_for(op, (9, 0)) == envinfo.EMULATED
    assert envinfo.path_for(op, (8, 0)) == envinfo.EMULATED
    assert envinfo.path_for(op, (10, 0)) == envinfo.NATIVE
    assert envinfo.path_for(op, (12, 0)) == envinfo.NATIVE
    assert envinfo.path_for(op, (9, 0), kernel=None).startswith("reference")
    assert envinfo.path_for(op, (7, 5)).startswith("reference")
    assert envinfo.path_for(op, (10, 0), force_reference=True).startswith("reference")
    assert envinfo.path_for(op, (10, 0), triton_ok=False).startswith("reference")
    assert "no FP4" in envinfo.path_for("attention recipe=bf16", (10, 0))
    assert envinfo.path_for("attention recipe=mxfp4", (9, 0)) == envinfo.EMULATED_FP8
    assert envinfo.path_for("nn.QuartetLinear", (8, 0)).startswith("reference")
    # availability comes from the module's existence
    assert envinfo._module_exists("fp4attn.metrics") and not envinfo._module_exists("fp4attn.kernels.nope")


def test_cli_bench_unknown_and_dispatch(capsys, monkeypatch):
    assert main(["bench", "definitely_not_a_bench"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'definitely_not_a_bench'" in err and "available:" in err
    assert main(["bench", "../etc"]) == 2
    # only modules with a main() are offered as benchmarks (helpers such as bench/common.py are not)
    assert _defines_main("fp4attn.accuracy") and not _defines_main("fp4attn.metrics")
    assert all(_defines_main(f"fp4attn.bench.{n}") for n in bench_names())
    seen = {}
    fake = types.ModuleType("fp4attn.bench.fake_for_test")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 3
    monkeypatch.setitem(sys.modules, "fp4attn.bench.fake_for_test", fake)
    assert main(["bench", "fake_for_test", "--n", "5", "x"]) == 3
    assert seen["argv"] == ["--n", "5", "x"]


@pytest.mark.parametrize("nq", ["0", "17"])
def test_cli_bench_decode_refuses_a_query_count_outside_1_to_16(capsys, nq):
    """``fp4attn bench decode --nq`` (new query tokens per sequence, what ``fp4attn.decode`` takes) is checked before
    any GPU work: a usage error naming the option, also on a machine without CUDA."""
    assert main(["bench", "decode", "--nq", nq]) == 2
    assert f"--nq: expected 1..16 new query tokens per sequence, got {nq}" in capsys.readouterr().err


@pytest.mark.parametrize("b2b", ["0", "-3"])
def test_cli_bench_decode_refuses_fewer_than_one_call_per_graph(capsys, b2b):
    """``--b2b`` (calls per CUDA graph of the back-to-back column) is checked before any GPU work."""
    assert main(["bench", "decode", "--b2b", b2b]) == 2
    assert f"--b2b: expected at least 1 call per CUDA graph (1: no back-to-back column), got {b2b}" in \
        capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_time_ms_times_one_of_reps_calls_captured_back_to_back():
    """``bench decode``'s back-to-back column: with ``reps`` the graph holds ``reps`` calls of the function (every
    replay runs it ``reps`` times, after the 3 warm-up calls of ``capture_graph``) and the time is per call."""
    from fp4attn.bench.common import graph_time_ms

    x = torch.zeros(1, device="cuda", dtype=torch.float64)
    t = graph_time_ms(lambda: x.add_(1.0), rep_ms=5.0, reps=7)
    n = int(x.item()) - 3
    assert t is not None and t > 0
    assert n > 0 and n % 7 == 0, n  # whole replays of 7 calls each


def test_cli_usage_errors(capsys, monkeypatch):
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "accuracy" in capsys.readouterr().out
    assert main(["accuracy", "--seq", "notanint"]) == 2
    assert all(_installed(module) for module, _ in SUBCOMMANDS.values())  # (every job ships with the package)
    # a job whose module is missing (a partial install): exit status 2 and a message naming it
    import fp4attn.cli as cli
    name, (module, _) = next(iter(SUBCOMMANDS.items()))
    monkeypatch.setattr(cli, "_installed", lambda m: m != module)
    capsys.readouterr()
    assert main([name]) == 2
    assert "not available" in capsys.readouterr().err


def test_python_dash_m():
    r = subprocess.run([sys.executable, "-m", "fp4attn", "--version"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("fp4attn ")


def test_device_options_are_checked_before_the_job_runs(capsys):
    """--device of the jobs: a device this machine has (cpu, cuda, cuda:N), else a usage error (exit status 2) at
    once instead of a traceback from deep inside the job; accuracy's --out is checked before it measures."""
    bad = ["meta", "foo"] + ([] if torch.cuda.is_available() else ["cuda"])
    for job in (["demo"], ["accuracy"], ["generate", "x"], ["bench", "reproduce"], ["bench", "quartet_train"]):
        for dev in bad:
            assert main([*job, "--device", dev]) == 2, (job, dev)
            assert "--device" in capsys.readouterr().err
    assert main(["accuracy", "--out", __file__ + "/x", "--seq", "16"]) == 2
    assert "--out" in capsys.readouterr().err


def test_jobs_needing_transformers_say_so(capsys, monkeypatch):
    """qat and generate need transformers (the hf extra): without it, a message naming it and exit status 2."""
    import fp4attn.cli as cli

    monkeypatch.setattr(cli, "_installed", lambda m: m != "transformers")
    for job in (["qat"], ["generate", "x", "--prompt-ids", "1,2"]):
        assert main(job) == 2
        assert "transformers" in capsys.readouterr().err
