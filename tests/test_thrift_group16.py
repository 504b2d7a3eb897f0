"""Thrift decode with a selection shared by each kv group (``fp4attn.decode``'s default ``thrift_share="group"``) on
the Gluon split kernel's ``GROUP16`` tiles: a page the group selected is computed from the 16-bit copy only, in the
same online softmax as the FP4 tiles, and its FP4 bytes are not read (``decode_fwd(group_sel=True)``).

GPU (``-m gpu``): against the paths it replaces (the FP4 kernel that masks the selected pages plus the separate
16-bit stream kernel, at D > 64; ``FUSED16`` at D <= 64) and against the reference with the same selection, with
ragged lengths, GQA, two new tokens, windows and sinks; the op's choice. CPU: the argument errors.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.ops.decode import decode_reference  # noqa: E402

# helpers of the decode tests (tests/ is on sys.path under pytest's default rootdir import mode)
from test_kvcache_decode import _rel, gpu  # noqa: E402
from test_thrift_decode_window import _case, _thrift_close  # noqa: E402


def test_group16_argument_errors(monkeypatch):
    """group16=True where it cannot run (no Gluon kernel: the CPU; no group-shared selection) is a ValueError that
    names it; fused16 and group16 together are one too."""
    from fp4attn.kernels import decode as Dk

    c, _, _, q = _case([200, 130], 4, 1, seed=3, dtype=torch.bfloat16)  # (GROUP16 runs on 16-bit copies)
    sel = Dk.select_pages(q, c, 0.25, share="group")
    with pytest.raises(ValueError, match="group16"):  # no Gluon kernel (the CPU)
        Dk.decode_fwd(q, c, scale=0.2, selection=sel, group_sel=True, group16=True)
    # with the Gluon kernel (as on sm_90; one split and no PIPE, so that nothing asks for a GPU before the check),
    # only the missing group-shared selection stops it ...
    monkeypatch.setattr(Dk, "_use_gluon", lambda *a, **kw: True)
    with pytest.raises(ValueError, match="group16"):
        Dk.decode_fwd(q, c, scale=0.2, selection=sel, group16=True, num_splits=1, pipe=False)
    # ... and with it the check passes (the launch then fails on the CPU, for another reason)
    if Dk.decode_gluon.HAVE_GLUON:
        with pytest.raises(Exception) as e:
            Dk.decode_fwd(q, c, scale=0.2, selection=sel, group_sel=True, group16=True, num_splits=1, pipe=False)
        assert "group16" not in str(e.value)
    monkeypatch.undo()
    if Dk.decode_gluon.HAVE_GLUON:
        buf = torch.empty(64, 32)
        with pytest.raises(ValueError, match="exclusive"):
            Dk.decode_gluon.launch(q, c, c.page_table, c.k_scale.view(torch.uint8), c.v_scale.view(torch.uint8), buf,
                                   buf[:, 0], buf[:, 1], 0.1, 1, 4, c.page_table.shape[1], 128, 3, 8, 64, sel, 4,
                                   fused16=True, group16=True)


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("D,G,nq,dtype", [(128, 4, 1, torch.bfloat16), (128, 4, 2, torch.bfloat16),
                                           (128, 1, 1, torch.bfloat16), (128, 4, 1, torch.float16),
                                           (64, 4, 1, torch.bfloat16), (64, 2, 4, torch.bfloat16),
                                           (96, 4, 1, torch.bfloat16)])
@pytest.mark.parametrize("window,sinks", [(None, False), (700, True)])
def test_group16_gpu_equals_the_paths_it_replaces_and_the_reference(D, G, nq, dtype, window, sinks):
    """GROUP16 against the same selection run by the paths it replaces and against the reference
    (test_thrift_decode_kernel_gpu's criteria, and no farther from it than the replaced path). Ragged sequences, bf16
    and fp16 caches, budget 0.1 (the union of G heads' pages: ~30%).

    Against the replaced path the output moves by up to 2^-8 relative L2 (measured 1.0e-3 on the H200 at D = 128,
    2.6e-5 at D = 64): both round the 16-bit pages' unquantized P̃ to V's dtype (a relative step of 2^-8 in bf16, 2^-11
    in fp16) for the product with V, GROUP16 against the split's running max, the 16-bit stream kernel (D > 64)
    against the running max of its own pages, so the two roundings differ; the reference keeps that P̃ unrounded. At
    D <= 64 (FUSED16, the same running max at equal splits) only the fp32 summation order and the output's rounding
    differ."""
    from fp4attn.kernels import decode as Dk

    if not _hopper():
        pytest.skip("the Gluon split kernel runs on sm_90")
    c, _, _, q = _case([4096 + 7, 2500, 1000], G, nq, seed=300 + D + G + nq, D=D, dtype=dtype, device="cuda")
    sc = D ** -0.5
    sel = Dk.select_pages(q, c, 0.1, window=window, share="group")
    s = (torch.randn(q.shape[1], generator=torch.Generator().manual_seed(7)) * 2).cuda() if sinks else None
    kw = dict(scale=sc, selection=sel, window=window, sinks=s, kernel="gluon", num_splits=5)
    got, lse = Dk.decode_fwd(q, c, group_sel=True, **kw)
    assert torch.equal(got, Dk.decode_fwd(q, c, group_sel=True, group16=True, **kw)[0])  # (the default there)
    old, old_lse = Dk.decode_fwd(q, c, group_sel=True, group16=False, **kw)
    assert _rel(got, old) <= 2 ** -8, _rel(got, old)
    if D <= 64:
        assert _rel(got, old) <= 1e-4, _rel(got, old)
    assert torch.allclose(lse, old_lse, atol=1e-4)
    ref, ref_lse = decode_reference(q, c, scale=sc, selection=sel.bool(), window=window, sinks=s)
    _thrift_close(got, ref)
    assert _rel(got, ref) <= 1.05 * _rel(old, ref) + 1e-4, (_rel(got, ref), _rel(old, ref))
    assert torch.allclose(lse, ref_lse.float(), atol=1e-3)


@pytest.mark.gpu
@gpu
def test_group16_gpu_is_the_ops_path_for_group_shared_selections(monkeypatch):
    """``fp4attn.decode`` runs GROUP16 for thrift_share="group" (and with one query head per kv head, where both rules
    agree), the previous paths for "head": the bits of ``decode_fwd`` with and without ``group_sel``."""
    from fp4attn.kernels import decode as Dk

    if not _hopper():
        pytest.skip("the Gluon split kernel runs on sm_90")
    monkeypatch.setattr(Dk, "_THRIFT_GLUON_MIN_WORK", 1)  # the Gluon path at this size too
    for G in (4, 1):
        c, _, _, q = _case([4096 + 7, 1500], G, 1, seed=400 + G, D=128, dtype=torch.bfloat16, device="cuda")
        for share in ("group", "head"):
            sel = Dk.select_pages(q, c, 0.05, share=share)
            want = Dk.decode_fwd(q, c, scale=128 ** -0.5, selection=sel, group_sel=share == "group" or G == 1)[0]
            assert torch.equal(fp4attn.decode(q, c, thrift_budget=0.05, thrift_share=share), want), (G, share)
