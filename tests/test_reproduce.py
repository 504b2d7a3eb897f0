"""``fp4attn bench reproduce --tiny`` on CPU: every part, both models, files with the expected rows and
finite numbers; the activation capture; the small helpers."""

import csv
import math
import os
import time

import pytest
import torch

from fp4attn.bench import quartet_train as qt
from fp4attn.bench import reproduce as rp
from fp4attn.cli import bench_names
from fp4attn.cli import main as cli_main
from fp4attn.demo import SIZES, Settings
from fp4attn.qat import DEFAULT_TEXT

RUNS = {"BF16 control", *(name for name, _ in rp.ABLATIONS)}
A_ROWS = {("BF16-trained", a) for a in ("bf16", "nvfp4 PTQ", "mxfp4 PTQ", "sage3 PTQ")} | {
    (w, a) for w in ("BF16 control", "Attn-QAT") for a in ("bf16", "nvfp4")}


def _text(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text(DEFAULT_TEXT * 3)
    return str(p)


def _rows(out, name):
    with open(os.path.join(out, name)) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reproduce")
    out = str(tmp / "out")
    t0 = time.time()
    rc = cli_main(["bench", "reproduce", "--tiny", "--data", _text(tmp), "--out", out, "--device", "cpu"])
    return rc, out, time.time() - t0


def test_registered_as_bench():
    assert "reproduce" in bench_names()


def test_tiny_runs_fast_and_writes_everything(tiny_run):
    rc, out, secs = tiny_run
    assert rc == 0
    assert secs < 60, f"--tiny took {secs:.0f} s"
    for name in ("reproduce.md", "reproduce.json", "reproduce_a.csv", "reproduce_b.csv", "reproduce_c.csv",
                 "reproduce_d.csv", "reproduce_d_claims.csv", "reproduce_curves.csv"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    for name in ("reproduce_a_loss.png", "reproduce_b_grad_norm.png", "reproduce_c_thrift.png",
                 "reproduce_d_orderings.png"):
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
    md = open(os.path.join(out, "reproduce.md")).read()
    header = md.split("## ")[0]
    for key in ("device: cpu", "date: ", "settings: parts a,b,c,d", "command: `fp4attn bench reproduce --tiny"):
        assert key in header, key
    assert "in progress" not in header
    for title in ("(a) FP4 PTQ degrades", "(b) Attn-QAT ablations", "(c) ThriftAttention", "(d) SageAttention3"):
        assert md.count(f"## {title}") == 1, title
    assert md.count("### LM") == 4 and md.count("### synthetic") == 4


def test_part_a_rows(tiny_run):
    _, out, _ = tiny_run
    rows = _rows(out, "reproduce_a.csv")
    lm_ctx = set(rp.LM_TINY["contexts"])
    syn_ctx = set(SIZES["tiny"]["contexts"])
    for model, ctxs in (("LM", lm_ctx), ("synthetic", syn_ctx)):
        mine = [r for r in rows if r["model"] == model]
        assert {(r["weights"], r["attention"]) for r in mine} == A_ROWS
        assert {int(r["context"]) for r in mine} == ctxs
        assert len(mine) == len(A_ROWS) * len(ctxs)
        for r in mine:
            assert math.isfinite(float(r["loss"])) and float(r["loss"]) > 0
    # the BF16 loss of the (barely) trained char LM is finite and below the uniform-guess loss
    vocab = len(set(DEFAULT_TEXT))
    bf16 = [float(r["loss"]) for r in rows if r["model"] == "LM" and r["attention"] == "bf16"]
    assert all(0 < x < math.log(vocab) for x in bf16)
    acc = [float(r["accuracy"]) for r in rows if r["model"] == "synthetic"]
    assert all(0.0 <= a <= 1.0 for a in acc)
    # the recovered share is defined exactly for the rows the table explains, finite or nan (no gap)
    qat = [r for r in rows if r["weights"] == "Attn-QAT" and r["attention"] == "nvfp4"]
    assert qat and all(r["recovered_loss"] not in ("", "inf", "-inf") for r in qat)


def test_part_b_ablation_rows(tiny_run):
    _, out, _ = tiny_run
    rows = _rows(out, "reproduce_b.csv")
    for model, steps in (("LM", rp.LM_TINY["ft_steps"]), ("synthetic", SIZES["tiny"]["qat_steps"])):
        mine = {r["run"]: r for r in rows if r["model"] == model}
        assert set(mine) == RUNS
        for r in mine.values():
            assert int(r["steps"]) == steps
            assert int(r["nonfinite_steps"]) == 0
            for k in ("final_train_loss", "eval_nvfp4_loss", "eval_bf16_loss", "gn_median", "gn_max"):
                assert math.isfinite(float(r[k])) and float(r[k]) > 0, (model, r["run"], k)
            assert float(r["gn_median"]) <= float(r["gn_p95"]) <= float(r["gn_max"])
    curves = _rows(out, "reproduce_curves.csv")
    for model, run, n in (("LM", "BF16 pre-training", rp.LM_TINY["pretrain_steps"]),
                          ("synthetic", "BF16 pre-training", SIZES["tiny"]["train_steps"]),
                          ("LM", "no O' (D from O)", rp.LM_TINY["ft_steps"]),
                          ("synthetic", "naive FA backward", SIZES["tiny"]["qat_steps"])):
        pts = [r for r in curves if r["model"] == model and r["run"] == run]
        assert [int(r["step"]) for r in pts] == list(range(n)), (model, run)
        assert all(math.isfinite(float(r["grad_norm"])) for r in pts)


def test_part_c_thrift_rows(tiny_run):
    _, out, _ = tiny_run
    rows = _rows(out, "reproduce_c.csv")
    for model, ctxs, block in (("LM", rp.LM_TINY["contexts"], rp.LM_TINY["thrift_block"]),
                               ("synthetic", SIZES["tiny"]["contexts"], Settings().thrift_block)):
        mine = [r for r in rows if r["model"] == model]
        assert {(int(r["context"]), float(r["budget"])) for r in mine} == {
            (c, b) for c in ctxs for b in rp.THRIFT_BUDGETS}
        for r in mine:
            n = int(r["n_blocks"])
            assert n == -(-int(r["context"]) // block)
            assert 1 <= int(r["k"]) <= n
            assert math.isfinite(float(r["loss"])) and math.isfinite(float(r["nvfp4_loss"]))
        # a larger budget never selects fewer blocks
        for c in ctxs:
            ks = [int(r["k"]) for r in sorted((r for r in mine if int(r["context"]) == c),
                                              key=lambda r: float(r["budget"]))]
            assert ks == sorted(ks)


def test_part_d_rows_have_the_models_shapes(tiny_run):
    _, out, _ = tiny_run
    rows = _rows(out, "reproduce_d.csv")
    lm = rp.LM_TINY
    syn = SIZES["tiny"]
    expect = {
        "LM": (lm["layers"], f"{lm['capture_batch']}x{lm['heads']}x{max(lm['contexts'])}x"
                             f"{lm['d_model'] // lm['heads']}"),
        "synthetic": (syn["n_layers"], f"{rp.SYN_CAPTURE_BATCH['tiny']}x{syn['n_heads']}x{max(syn['contexts'])}x"
                                       f"{syn['d_model'] // syn['n_heads']}"),
    }
    for model, (layers, shape) in expect.items():
        mine = [r for r in rows if r["model"] == model]
        assert {int(r["layer"]) for r in mine} == set(range(layers))
        assert {r["shape"] for r in mine} == {shape}
        assert {(int(r["layer"]), r["recipe"]) for r in mine} == {(i, x) for i in range(layers) for x in rp.D_RECIPES}
        for r in mine:
            assert 0.9 < float(r["cossim"]) <= 1.0 + 1e-9
            assert 0.0 < float(r["rel_l1"]) < 1.0 and float(r["rmse"]) > 0
    claims = _rows(out, "reproduce_d_claims.csv")
    assert {(r["model"], r["better"], r["worse"]) for r in claims} == {
        (m, good, bad) for m in expect for _, good, bad in rp._claims()}
    for r in claims:
        assert 0 <= int(r["layers_holding"]) <= int(r["layers"]) == expect[r["model"]][0]


def test_capture_is_post_rope_qkv_of_every_layer(tmp_path):
    cfg = rp.LMConfig(**rp.LM_TINY)
    task = rp._LMTask(cfg, _text(tmp_path), torch.device("cpu"), seed=3)
    model = task.new_model()
    cap = task.capture(model)
    B, H, N, D = task.capture_shape()
    assert len(cap) == cfg.layers
    for q, k, v, scale in cap:
        assert q.shape == k.shape == v.shape == (B, H, N, D) and scale is None
    # layer 0's Q and K are RoPE(projections of the normed embeddings) of the capture windows
    x, _ = qt.batch(task.val_ids, B, N, torch.Generator().manual_seed(3 + 4321))
    blk = model.layers[0]
    with torch.no_grad():
        h = blk.norm1(model.embed(x))
        q = qt._rope(blk.q_proj(h).view(B, N, H, D).transpose(1, 2))
        v = blk.v_proj(h).view(B, N, H, D).transpose(1, 2)
    torch.testing.assert_close(cap[0][0], q)
    torch.testing.assert_close(cap[0][2], v)
    # the hooks are gone and the model runs SDPA again
    assert all(not blk.attn._forward_hooks and blk.attn.fn is None for blk in model.layers)


def test_synthetic_capture_sees_the_k_outlier_channel():
    s = Settings(**SIZES["tiny"])
    task = rp._SyntheticTask(s, torch.device("cpu"), capture_batch=2)
    cap = task.capture(task.new_model())
    assert len(cap) == s.n_layers
    for q, k, _, _ in cap:
        assert q.shape == (2, s.n_heads, max(s.contexts), s.d_model // s.n_heads)
        # every head's K has one channel offset by +-k_outlier x RMS(K) on every token (demo.Block)
        mean = k.mean(dim=2).abs()                        # (B, H, D): per-channel mean over tokens
        top2 = mean.topk(2, dim=-1).values
        assert (top2[..., 0] > 5 * top2[..., 1]).all()


def test_without_data_the_lm_is_skipped(tmp_path):
    out = str(tmp_path / "out")
    assert rp.main(["--tiny", "--parts", "d", "--out", out, "--device", "cpu"]) == 0
    md = open(os.path.join(out, "reproduce.md")).read()
    assert "LM part skipped: no --data" in md and "### LM" not in md and "### synthetic" in md
    assert {r["model"] for r in _rows(out, "reproduce_d.csv")} == {"synthetic"}
    assert _rows(out, "reproduce_b.csv") == []


@pytest.mark.parametrize("argv", [["--parts", "a,x"], ["--models", "gpt"], ["--models", "lm"]])
def test_bad_selection_is_rejected(argv, tmp_path):
    assert rp.main([*argv, "--tiny", "--out", str(tmp_path), "--device", "cpu"]) == 2


def test_recovered_and_grad_norm_stats():
    assert rp.recovered(1.5, fp4=2.0, ref=1.0, higher_is_better=False) == pytest.approx(0.5)
    assert rp.recovered(0.9, fp4=0.8, ref=1.0, higher_is_better=True) == pytest.approx(0.5)
    assert math.isnan(rp.recovered(1.0, fp4=1.0, ref=1.0, higher_is_better=False))      # no gap
    assert math.isnan(rp.recovered(1.0, fp4=0.9, ref=1.0, higher_is_better=False))      # FP4 better: no gap
    st = rp.grad_norm_stats([1.0, 10.0, 1.0, float("nan")])
    assert st["gn_roughness"] == pytest.approx(1.0) and st["nonfinite_steps"] == 1
    assert st["gn_median"] == 1.0 and st["gn_max"] == 10.0


def test_check_claims_rule():
    def row(layer, recipe, cos, l1, rmse):
        return dict(model="m", layer=layer, recipe=recipe, cossim=cos, rel_l1=l1, rmse=rmse)
    rows = [row(0, "nvfp4", 0.99, 0.1, 0.1), row(0, "mxfp4", 0.98, 0.2, 0.2),
            row(1, "nvfp4", 0.99, 0.1, 0.3), row(1, "mxfp4", 0.98, 0.2, 0.2)]   # layer 1: RMSE worse
    (c,) = [c for c in rp.check_claims(rows) if c["worse"] == "mxfp4"]
    assert (c["layers_holding"], c["layers"]) == (1, 2)


def test_warm_specs_cover_what_the_run_compiles(tmp_path, capsys):
    lm = rp._LMTask(rp.LMConfig(), _long_text(tmp_path), torch.device("cpu"), seed=0)
    syn = rp._SyntheticTask(Settings(), torch.device("cpu"), capture_batch=8)
    specs = rp._warm_specs([lm, syn], list(rp.PARTS))
    assert len(specs) == len(set(specs))
    qat = {s for s in specs if s[0] == "qat"}
    assert {(s[1], s[2], s[3]) for s in qat} == {(4, 64, "bfloat16"), (2, 32, "bfloat16")}
    assert {dict(s[4]).get("backward", "qat") for s in qat} == {"qat", "naive"} and len(qat) == 8
    assert {(s[3], s[4]) for s in specs if s[0] == "attention" and s[2] == 32} == {
        ("float32", r) for r in ("bf16", *rp.D_RECIPES)}            # the demo evaluates in float32
    assert [s[1:] for s in specs if s[0] == "thrift"] == [(4, 64, "bfloat16", 64)]   # block 16: no kernel
    assert not [s for s in rp._warm_specs([lm], ["d"]) if s[0] == "qat"]
    # the process pool runs in spawned children; without CUDA every job reports its error, nothing raises
    secs = rp.warm_kernels(specs[:1], 1)
    assert secs > 0 and "1 failed" in capsys.readouterr().out


def _long_text(tmp_path):
    p = tmp_path / "long.txt"
    p.write_text(DEFAULT_TEXT * 8)   # a validation split longer than the default 2048-char context
    return str(p)
