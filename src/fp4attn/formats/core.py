"""The FP4 formats in plain PyTorch: the single source of truth for E2M1, E4M3 and E8M0 rounding.

Everything here is bit-exact to ``SPEC.md`` §2 and runs on any device (float32 arithmetic with
IEEE rounding). The Triton kernels implement the same rules once more, in
``fp4attn.formats.triton_helpers``; tests compare the two bit for bit.

Element format E2M1 (codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign), rounded to nearest with
ties to the even code, saturating at ±6 (what ``cvt.rn.satfinite.e2m1x2.f32`` does).

* NVFP4: blocks of 16, scale ``s_b = e4m3_rn_satfinite(amax_b / 6 * S_enc)``; optional per-tensor
  global encode scale ``S_enc = 448*6 / amax_tensor`` (stored as its decode scale ``1/S_enc``).
* MXFP4: blocks of 32, scale ``2**e`` stored as E8M0; ``e = ceil(log2(amax_b/6))`` ("rceil") or
  ``floor(log2(amax_b)) - 2`` ("floor", OCP MX v1.0), clamped to [-127, 127].

A block containing NaN or +-Inf gets a NaN scale, so it dequantizes to NaN.
Design choices the spec leaves open (documented and tested):
* a block whose NVFP4 scale rounds to 0 stores codes 0 (it dequantizes to +0);
* the global amax is taken over the finite elements only (a NaN elsewhere must not wipe out every
  block), and ``S_enc`` is clamped to the largest finite float32;
* dequantization multiplies by the stored decode scale after the exact product:
  ``(q * s_b) * (1/S_enc)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
FORMATS = ("nvfp4", "mxfp4")
SCALE_MODES = ("rceil", "floor")

# E2M1 magnitudes by code (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def block_size(fmt: str) -> int:
    if fmt == "nvfp4":
        return NVFP4_BLOCK
    if fmt == "mxfp4":
        return MXFP4_BLOCK
    raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


# ----------------------------------------------------------------------------------------------
# Element and scale rounding (float32 in, exact results out)
# ----------------------------------------------------------------------------------------------
def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """float32 -> E2M1 code (uint8, sign in bit 3), round to nearest, ties to even code, saturating.

    The magnitude code is the number of decision thresholds passed; at a tie the threshold counts
    as passed only when the upper neighbour has the even code (0.75, 1.75, 3.5 go up; 0.25, 1.25,
    2.5, 5 go down). NaN encodes as +0 (callers flag NaN blocks through the scale).
    """
    a = v.abs()
    code = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75).to(torch.uint8)
        + (a > 1.25).to(torch.uint8)
        + (a >= 1.75).to(torch.uint8)
        + (a > 2.5).to(torch.uint8)
        + (a >= 3.5).to(torch.uint8)
        + (a > 5.0).to(torch.uint8)
    )
    sign = torch.signbit(v) & ~torch.isnan(v)
    return code | (sign.to(torch.uint8) << 3)


_E2M1_TABLE_CACHE: dict = {}


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 code (uint8, low 4 bits) -> float32 value (code 0x8 is -0.0)."""
    key = codes.device
    table = _E2M1_TABLE_CACHE.get(key)
    if table is None:
        mags = list(E2M1_VALUES)
        table = torch.tensor(mags + [-m for m in mags], dtype=torch.float32, device=codes.device)
        _E2M1_TABLE_CACHE[key] = table
    return table[(codes & 0xF).long()]


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest E2M1 value (as float32), ties to even code, saturating at +-6."""
    return e2m1_decode(e2m1_encode(v))


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """float32 (>= 0 or NaN) -> E4M3 (float8_e4m3fn), round to nearest even, saturating at 448.

    ``torch``'s cast rounds to nearest even (subnormals included) but maps values past the
    range to NaN, so the saturation is done first (values in (448, 464) round to 448 anyway).
    """
    return torch.clamp(x, max=E4M3_MAX).to(torch.float8_e4m3fn)


def mx_exponent(amax: torch.Tensor, scale_mode: str = "rceil") -> torch.Tensor:
    """Block amax (float32, >= 0, finite) -> E8M0 exponent e (int32), clamped to [-127, 127].

    Computed from the exact binary exponent of amax (no rounded log2): with
    amax = m * 2**E0, m in [1, 2):
      floor: e = E0 - 2
      rceil: the least e with 6 * 2**e >= amax, i.e. E0 - 2 if m <= 1.5 else E0 - 1.
    A zero block gets e = -127 (it dequantizes to zeros).
    """
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")
    mant, exp = torch.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1)
    e0 = exp.to(torch.int32) - 1
    if scale_mode == "floor":
        e = e0 - 2
    else:
        e = torch.where(mant <= 0.75, e0 - 2, e0 - 1)
    e = torch.where(amax > 0, e, torch.full_like(e, -127))
    return e.clamp(-127, 127)


# ----------------------------------------------------------------------------------------------
# Block quantization (the one implementation; quantize/fake_quantize/kernels' tests use it)
# ----------------------------------------------------------------------------------------------
@dataclass
class _Blocks:
    codes: torch.Tensor  # uint8, (..., nblocks, bs), sign in bit 3
    scale: torch.Tensor  # float32 (..., nblocks): the block scale value (NaN for bad blocks)
    scale_store: torch.Tensor  # float8_e4m3fn | float8_e8m0fnu, (..., nblocks)
    decode_global: torch.Tensor | None  # float32 scalar 1/S_enc, or None


def global_encode_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4 per-tensor encode scale S_enc = 448*6 / amax (float32; 1 when amax is 0).

    amax is taken over finite elements; S_enc is clamped to the largest finite float32.
    """
    a = x.float().abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    amax = a.amax() if a.numel() else torch.zeros((), device=x.device)
    s_enc = torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32, device=x.device) / amax
    s_enc = torch.where(amax > 0, s_enc, torch.ones_like(s_enc))
    return s_enc.clamp(max=torch.finfo(torch.float32).max)


def quantize_blocks(
    xb: torch.Tensor,
    fmt: str,
    *,
    scale_mode: str = "rceil",
    global_scale: bool = False,
    s_enc: torch.Tensor | None = None,
) -> _Blocks:
    """Quantize float32 blocks ``xb`` of shape (..., nblocks, bs) (bs = the format's block)."""
    xb = xb.float()
    bs = block_size(fmt)
    assert xb.shape[-1] == bs, (xb.shape, bs)
    bad = ~torch.isfinite(xb).all(dim=-1)
    amax = torch.where(torch.isfinite(xb), xb.abs(), torch.zeros_like(xb)).amax(dim=-1)
    if fmt == "nvfp4":
        if scale_mode != "rceil":
            raise ValueError("scale_mode applies to fmt='mxfp4' only (NVFP4 scales are E4M3)")
        dec_g = None
        if global_scale:
            if s_enc is None:
                s_enc = global_encode_scale(xb)
            s_enc = s_enc.float()
            s8 = e4m3_round((amax / E2M1_MAX) * s_enc)
            s = s8.float()
            denom = s / s_enc
            dec_g = (1.0 / s_enc).float()
            deq = s
        else:
            s8 = e4m3_round(amax / E2M1_MAX)
            s = s8.float()
            denom = s
            deq = s
        v = xb / denom.unsqueeze(-1)
        codes = e2m1_encode(v)
        codes = torch.where((s == 0).unsqueeze(-1), torch.zeros_like(codes), codes)
        nan8 = torch.tensor(float("nan"), device=xb.device).to(torch.float8_e4m3fn)
        s8 = torch.where(bad, nan8.expand_as(s8), s8)
        deq = torch.where(bad, torch.full_like(deq, float("nan")), deq)
        return _Blocks(codes, deq, s8, dec_g)
    if global_scale:
        raise ValueError("global_scale applies to fmt='nvfp4' only (MXFP4 scales are powers of two)")
    e = mx_exponent(amax, scale_mode)
    scale = torch.ldexp(torch.ones_like(amax), e)
    v = xb / scale.unsqueeze(-1)
    codes = e2m1_encode(v)
    store = (e + 127).to(torch.uint8)
    store = torch.where(bad, torch.full_like(store, 255), store).view(torch.float8_e8m0fnu)
    deq = torch.where(bad, torch.full_like(scale, float("nan")), scale)
    return _Blocks(codes, deq, store, None)


def blocks_dequantize(b: _Blocks) -> torch.Tensor:
    """Dequantized float32 blocks: (code value * block scale) * global decode scale.

    code * scale is exact in float32 (a 2-bit by 4-bit significand product); with a global scale the value is
    that product times the stored decode scale g = fl(1 / S_enc) (what every consumer of an FP4Tensor can
    compute from its fields, and what the kernels compute), rounded once: within one ulp of q * s_b / S_enc,
    not always equal to it (g itself is rounded).
    """
    v = e2m1_decode(b.codes) * b.scale.unsqueeze(-1)
    return v if b.decode_global is None else v * b.decode_global


# ----------------------------------------------------------------------------------------------
# Packing: two codes per byte, element 2i in the low nibble
# ----------------------------------------------------------------------------------------------
def pack_last(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes (..., L) with L even -> bytes (..., L/2); element 2i in the low nibble."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] & 0xF) | ((c[..., 1] & 0xF) << 4)


def unpack_last(data: torch.Tensor) -> torch.Tensor:
    """bytes (..., L/2) -> uint8 codes (..., L)."""
    lo = data & 0xF
    hi = (data >> 4) & 0xF
    return torch.stack([lo, hi], dim=-1).reshape(*data.shape[:-1], data.shape[-1] * 2)


# ----------------------------------------------------------------------------------------------
# Public tensor type and functions
# ----------------------------------------------------------------------------------------------
@dataclass
class FP4Tensor:
    """A block-quantized FP4 tensor (NVFP4 or MXFP4).

    data: uint8 with the original shape except ``dim`` halved; two E2M1 codes per byte along ``dim``,
      element 2i in the low nibble (``.data.view(torch.float4_e2m1fn_x2)`` gives the torch dtype view).
    scales: one per block, same shape as the original except ``dim`` divided by the block size;
      ``float8_e4m3fn`` (NVFP4) or ``float8_e8m0fnu`` (MXFP4).
    global_scale: float32 scalar decode scale ``1/S_enc`` (NVFP4 with ``global_scale=True``) or None.
    """

    data: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor | None
    fmt: str
    dim: int
    shape: torch.Size
    dtype: torch.dtype

    @property
    def block_size(self) -> int:
        return block_size(self.fmt)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def fp4_view(self) -> torch.Tensor:
        """The packed data viewed as ``torch.float4_e2m1fn_x2`` (needs torch >= 2.8)."""
        return self.data.view(torch.float4_e2m1fn_x2)

    def codes(self) -> torch.Tensor:
        """Unpacked E2M1 codes (uint8, one per element, in the original shape)."""
        d = self.data.movedim(self.dim, -1)
        return unpack_last(d).movedim(-1, self.dim)

    def scale_values(self) -> torch.Tensor:
        """Per-block scales as float32 (NaN for non-finite blocks); the global scale is separate."""
        if self.fmt == "nvfp4":
            s = self.scales.float()
        else:
            raw = self.scales.view(torch.uint8)
            s = torch.ldexp(torch.ones(raw.shape, device=raw.device), raw.to(torch.int32) - 127)
            s = torch.where(raw == 255, torch.full_like(s, float("nan")), s)
        return s

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        codes = self.codes().movedim(self.dim, -1)
        bs = self.block_size
        cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // bs, bs)
        s = self.scale_values().movedim(self.dim, -1)
        out = (e2m1_decode(cb) * s.unsqueeze(-1)).reshape(codes.shape)
        if self.global_scale is not None:
            out = out * self.global_scale  # after the exact code*scale product: one rounding
        return out.movedim(-1, self.dim).to(dtype)

    def __repr__(self) -> str:
        return (f"FP4Tensor(fmt={self.fmt!r}, shape={tuple(self.shape)}, dim={self.dim}, "
                f"dtype={self.dtype}, global_scale={self.global_scale is not None})")


def _norm_dim(dim: int, ndim: int) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if ndim == 0:
        raise ValueError("x must have at least one dimension")
    if not -ndim <= dim < ndim:
        raise ValueError(f"dim must be in [{-ndim}, {ndim - 1}] for a {ndim}-d tensor, got {dim}")
    return dim % ndim


def _check_x(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")


def _check_fmt(fmt: str, scale_mode: str, global_scale: bool) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")
    if fmt == "nvfp4" and scale_mode != "rceil":
        raise ValueError("scale_mode='floor' applies to fmt='mxfp4' only (NVFP4 scales are E4M3)")
    if not isinstance(global_scale, bool):
        raise TypeError(f"global_scale must be a bool, got {global_scale!r}")
    if fmt == "mxfp4" and global_scale:
        raise ValueError("global_scale=True applies to fmt='nvfp4' only (MXFP4 scales are powers of two)")


def quantize_reference(x, fmt="nvfp4", dim=-1, *, scale_mode="rceil", global_scale=False) -> FP4Tensor:
    """The PyTorch implementation of :func:`fp4attn.quantize` (runs on any device)."""
    _check_x(x)
    _check_fmt(fmt, scale_mode, global_scale)
    d = _norm_dim(dim, x.dim())
    bs = block_size(fmt)
    L = x.shape[d]
    if L % bs:
        raise ValueError(f"x.shape[dim]={L} must be a multiple of the {fmt} block size {bs} "
                         "(fake_quantize pads; quantize does not)")
    xt = x.detach().float().movedim(d, -1)
    xb = xt.reshape(*xt.shape[:-1], L // bs, bs)
    b = quantize_blocks(xb, fmt, scale_mode=scale_mode, global_scale=global_scale)
    data = pack_last(b.codes.reshape(xt.shape)).movedim(-1, d).contiguous()
    scales = b.scale_store.movedim(-1, d).contiguous()
    return FP4Tensor(data, scales, b.decode_global, fmt, d, x.shape, x.dtype)


def fake_quantize_values(x: torch.Tensor, fmt="nvfp4", dim=-1, *, scale_mode="rceil",
                         global_scale=False, s_enc: torch.Tensor | None = None) -> torch.Tensor:
    """quantize(x).dequantize() as float32, with zero padding of ``dim``; no autograd."""
    d = dim % x.dim()
    bs = block_size(fmt)
    xt = x.detach().float().movedim(d, -1)
    L = xt.shape[-1]
    pad = (-L) % bs
    if pad:
        xt = torch.nn.functional.pad(xt, (0, pad))
    xb = xt.reshape(*xt.shape[:-1], (L + pad) // bs, bs)
    if global_scale and s_enc is None:
        s_enc = global_encode_scale(x)
    b = quantize_blocks(xb, fmt, scale_mode=scale_mode, global_scale=global_scale, s_enc=s_enc)
    out = blocks_dequantize(b).reshape(xt.shape)[..., :L]
    return out.movedim(-1, d)


class _FakeQuantizeSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt, dim, scale_mode, global_scale):
        return fake_quantize_values(x, fmt, dim, scale_mode=scale_mode,
                                    global_scale=global_scale).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None, None


def fake_quantize_reference(x, fmt="nvfp4", dim=-1, *, scale_mode="rceil", global_scale=False):
    """The PyTorch implementation of :func:`fp4attn.fake_quantize` (straight-through gradient)."""
    _check_x(x)
    _check_fmt(fmt, scale_mode, global_scale)
    d = _norm_dim(dim, x.dim())
    return _FakeQuantizeSTE.apply(x, fmt, d, scale_mode, global_scale)
