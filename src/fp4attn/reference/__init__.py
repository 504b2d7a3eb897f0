"""The spec in plain PyTorch: every kernel is tested against these (SPEC §3-4).

Inputs are bhsd tensors (GQA allowed); the functions compute in float32 (float64 when given
float64), process queries in row chunks (no N×N materialization), and implement the one-shot P̃
semantics exactly. See :mod:`fp4attn.reference.common` for the glossary (P̃, O', LSE, D).
"""

from .attention import RECIPES, attention, recipe_flags
from .attn_qat import attn_qat_backward, attn_qat_forward, attn_qat_reference
from .thrift import budget_to_k, select_blocks, thrift_attention

__all__ = [
    "RECIPES", "attention", "recipe_flags", "attn_qat_forward", "attn_qat_backward",
    "attn_qat_reference", "thrift_attention", "budget_to_k", "select_blocks",
]
