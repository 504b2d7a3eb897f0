"""PyTorch model of ``fp4attn.formats.triton_helpers.fake_quant_p_f16`` (the Gluon attention pass's float16 P̃
rounding), shared by the quantizer and attention kernel tests. A model of a kernel's arithmetic, not the spec:
the spec's ϕ(P̃) is ``fp4attn.formats.core.fake_quantize_values``."""
import torch

from fp4attn.formats import core


def fake_quant_p_f16_model(p: torch.Tensor) -> torch.Tensor:
    """What ``fake_quant_p_f16`` computes, in PyTorch: P̃ rounded to float16, E4M3 scales of the float32 block
    maxima, the reciprocal rounded to float16, the float16 quotient, the reference's E2M1 rounding of it."""
    pb = p.half().view(*p.shape[:-1], -1, 16)
    s = core.e4m3_round(pb.amax(-1, keepdim=True).float() * torch.tensor(1.0 / 6.0)).float()
    inv = (1.0 / s.clamp_min(2.0 ** -9)).half()
    return (core.e2m1_round((pb * inv).float()) * s).half().view(p.shape)
