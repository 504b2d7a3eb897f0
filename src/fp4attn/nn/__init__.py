"""Neural-network modules: :class:`QuartetLinear` (MXFP4 training of linear layers, SPEC §4)."""

from .quartet import QuartetLinear, quartet_linear, swap_linear_layers

__all__ = ["QuartetLinear", "quartet_linear", "swap_linear_layers"]
