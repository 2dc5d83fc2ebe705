"""How a step's FLOPs split among operator families: convolutions, matrix products, elementwise operators.

`energyprof estimate` tells model families apart by these shares (an MLP's energy per FLOP says little of a
CNN's). torch's FlopCounterMode counts matrix products, convolutions and attention; the elementwise operators
are counted in the same run through its `custom_mapping` (one FLOP an output element), and kept apart from
the FLOPs figure, which stays torch's. Pure but for `elementwise_mapping`, which reads torch's operators.
"""

from __future__ import annotations

import math
from typing import Any

# Pointwise operators of a training step (activations, their gradients, residual adds, scaling): one FLOP an
# output element. FlopCounterMode counts none of them by itself.
ELEMENTWISE_OPS = ("add", "sub", "mul", "div", "relu", "threshold_backward", "gelu", "gelu_backward", "sigmoid",
                   "sigmoid_backward", "tanh", "tanh_backward", "silu", "silu_backward", "exp", "neg", "pow", "sqrt",
                   "rsqrt", "clamp", "where", "maximum", "minimum", "leaky_relu", "leaky_relu_backward")
# operator name (aten.X's X, overload and backward dropped) -> family
_FAMILIES = {"convolution": "conv", "_convolution": "conv", "cudnn_convolution": "conv",
             "mm": "matmul", "addmm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "matmul": "matmul"}


def elementwise_flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    n = 1
    for d in out_shape or ():
        n *= int(d)
    return n if out_shape is not None else 0


def flop_shares(counts: dict[str, float]) -> tuple[float, dict[str, float]]:
    """(the step's FLOPs as torch counts them, elementwise left out; each family's share of all counted:
    conv, matmul, elementwise, other (attention and what else torch counts)). `counts`: operator -> FLOPs."""
    fam = {"conv": 0.0, "matmul": 0.0, "elementwise": 0.0, "other": 0.0}
    for op, n in counts.items():
        name = str(op).removeprefix("aten.").split(".")[0]  # aten.convolution_backward.default -> convolution_backward
        family = "elementwise" if name in ELEMENTWISE_OPS else _FAMILIES.get(name.removesuffix("_backward"), "other")
        fam[family] += n
    every = math.fsum(fam.values())
    return every - fam["elementwise"], {k: v / every for k, v in fam.items()} if every > 0 else {}


def elementwise_mapping(torch: Any) -> dict[Any, Any]:
    """FlopCounterMode's custom_mapping for the elementwise operators this torch has."""
    aten = torch.ops.aten
    return {getattr(aten, name): elementwise_flops for name in ELEMENTWISE_OPS if hasattr(aten, name)}
