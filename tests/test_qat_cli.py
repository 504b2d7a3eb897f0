"""``fp4attn qat`` at a tiny setting: outputs, checkpoint + --resume reproducing an uninterrupted run,
and :func:`fp4attn.qat.prepare`."""

import json
import os

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from fp4attn import qat  # noqa: E402
from fp4attn.cli import main  # noqa: E402

TINY = ["--steps", "4", "--pretrain-steps", "3", "--seq-len", "24", "--batch", "2", "--hidden", "32",
        "--layers", "1", "--heads", "2", "--kv-heads", "1", "--eval-windows", "2", "--ckpt-every", "2"]


def _log(out):
    with open(os.path.join(out, "qat_log.json")) as f:
        return json.load(f)


def test_qat_cli_tiny_and_resume(tmp_path):
    full, parts = str(tmp_path / "full"), str(tmp_path / "parts")
    assert main(["qat", *TINY, "--out", full]) == 0
    for name in ("qat_results.md", "qat_results.csv", "qat_loss.png", "qat_grad_norm.png", "qat_ckpt.pt"):
        assert os.path.getsize(os.path.join(full, name)) > 0, name
    md = open(os.path.join(full, "qat_results.md")).read()
    assert "before fine-tune" in md and "after Attn-QAT" in md and "nvfp4 attention (PTQ)" in md
    ref = _log(full)
    assert len(ref["log"]["pretrain"]) == 3 and len(ref["log"]["qat"]) == 4
    assert all(g > 0 for g in ref["log"]["qat_gn"])  # gradients flow through the Attn-QAT op

    # interrupted twice (once in pre-training, once in the fine-tune), resumed: the same run
    assert main(["qat", *TINY, "--out", parts, "--stop-after", "2"]) == 0
    assert not os.path.exists(os.path.join(parts, "qat_results.md"))
    assert main(["qat", *TINY, "--out", parts, "--resume", "--stop-after", "3"]) == 0
    # another model width or data order is another run: refused, naming the option (a width ended in a traceback)
    for opt, val in (("--hidden", "64"), ("--seq-len", "32")):
        other = list(TINY)
        other[other.index(opt) + 1] = val
        assert main(["qat", *other, "--out", parts, "--resume"]) == 2, opt
    assert main(["qat", *TINY, "--out", parts, "--resume"]) == 0
    got = _log(parts)
    for key in ("pretrain", "qat", "qat_gn"):
        assert got["log"][key] == pytest.approx(ref["log"][key], rel=1e-5, abs=1e-6), key
    assert got["after"]["fp4"] == pytest.approx(ref["after"]["fp4"], rel=1e-5)


def test_qat_cli_text_file_and_mxfp4(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcdefgh ijklmnop qrstuvwx yz " * 40)
    out = str(tmp_path / "o")
    args = [a if a != "4" else "2" for a in TINY]
    assert main(["qat", str(text), *args, "--fmt", "mxfp4", "--pretrain-steps", "0", "--out", out]) == 0
    md = open(os.path.join(out, "qat_results.md")).read()
    assert "mxfp4 attention" in md
    assert len(_log(out)["log"]["qat"]) == 2


def test_prepare_switches_to_attn_qat(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    import fp4attn
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = qat.prepare(LlamaForCausalLM(cfg), fmt="mxfp4")
    assert model.config._attn_implementation == "fp4attn_mxfp4"
    seen = []
    real = fp4attn.attn_qat
    monkeypatch.setattr(fp4attn, "attn_qat", lambda *a, **kw: seen.append(kw["fmt"]) or real(*a, **kw))
    ids = torch.randint(0, 64, (1, 16))
    model.train()
    model(ids, labels=ids).loss.backward()
    assert seen == ["mxfp4"]
    with pytest.raises(ValueError, match="fmt"):
        qat.prepare(model, fmt="int4")


@pytest.mark.parametrize("kw", [{"backward": "naive"}, {"high_precision_o": False}, {"quantize_p_in_backward": False}])
def test_prepare_with_an_ablation_trains_and_evaluates(kw):
    """prepare()'s Attn-QAT ablation switches reach attn_qat in training and stay out of the inference op in eval
    mode (it has no such arguments: eval raised a TypeError)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = qat.prepare(LlamaForCausalLM(cfg), **kw)
    ids = torch.randint(0, 64, (1, 16))
    model.train()
    model(ids, labels=ids).loss.backward()
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(ids, labels=ids).loss)


def test_qat_cli_refuses_counts_it_cannot_run():
    """--steps 0 or --ckpt-every 0 divided by zero after the whole pre-training: usage errors at once now."""
    from fp4attn.cli import main

    for args in (["--steps", "0"], ["--ckpt-every", "0"], ["--batch", "0"], ["--stop-after", "0"],
                 ["--steps", "x"]):
        assert main(["qat", *args]) == 2, args
