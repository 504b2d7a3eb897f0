"""Why fp4attn.attention(recipe="bf16") gave NaN for 16-bit non-contiguous inputs in the fuzz: SDPA
per backend on views of a padded buffer (offset 4 elements, row stride D+8), with the padding set to
NaN or to zeros, against the math backend on contiguous copies."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)


def views(B, N, H, D, dtype, pad_value, layout):
    full = torch.full((B, N, H, D + 8), pad_value, device="cuda", dtype=dtype)
    full[..., 4:4 + D] = torch.randn(B, N, H, D, device="cuda", dtype=dtype)
    x = full[..., 4:4 + D]  # (B, N, H, D), last dim contiguous, data pointer 8 bytes off 16
    return x.transpose(1, 2)  # bhsd view, as check_attention_args passes it to SDPA


for dtype in (torch.bfloat16, torch.float16):
    for (B, nq, nk, H, Hk, D) in [(2, 2, 17, 1, 1, 32), (1, 17, 17, 4, 1, 32), (2, 127, 127, 8, 4, 144),
                                  (1, 256, 426, 1, 1, 112), (2, 64, 64, 2, 2, 64)]:
        for pad in (float("nan"), 0.0):
            q = views(B, nq, H, D, dtype, pad, "bshd")
            k = views(B, nk, Hk, D, dtype, pad, "bshd")
            v = views(B, nk, Hk, D, dtype, pad, "bshd")
            want = torch.nn.functional.scaled_dot_product_attention(
                q.float().contiguous(), k.float().contiguous(), v.float().contiguous(), enable_gqa=H != Hk)
            row = []
            for name, be in (("default", None), ("flash", SDPBackend.FLASH_ATTENTION),
                             ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                             ("math", SDPBackend.MATH)):
                try:
                    if be is None:
                        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hk)
                    else:
                        with sdpa_kernel([be]):
                            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hk)
                    err = ((o.float() - want).norm() / want.norm()).item()
                    row.append(f"{name}: nan={int(o.isnan().sum())} err={err:.2e}")
                except Exception as e:
                    row.append(f"{name}: {type(e).__name__} {str(e)[:60]}")
            print(str(dtype)[6:], (B, nq, nk, H, Hk, D), "pad", pad, " | ".join(row))
