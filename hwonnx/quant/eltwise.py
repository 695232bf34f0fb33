"""Quantization of the binary element-wise operators (float ``Eltwise`` -> ``QEltwise``).

Each input keeps its own scale and zero point and the result is requantized once, as the QDQ
float semantics (DequantizeLinear -> op -> QuantizeLinear) define it; the integer formulation
and its bound are in ``docs/arithmetic.md``, "Element-wise operators".
"""

import numpy as np

from ..ir import Node
from .params import add_constants, clamp_bounds, requant_params

__all__ = ["ELTWISE_UNIT", "eltwise_constants", "quantize_eltwise"]

#: The larger of the two integer input weights ``ka``, ``kb`` of a sum, maximum or minimum:
#: their ratio approximates the ratio of the input scales to 2**-17 relative (of the larger),
#: and ``255 * (|ka| + |kb|) < 2**26`` keeps the accumulator far inside int32.
ELTWISE_UNIT = 1 << 16


def eltwise_constants(kind: str, a: "tuple[float, int]", b: "tuple[float, int]",
                      out_scale: float, signs=(1, 1), count: int = 2) -> "tuple[dict, float]":
    """The ``QEltwise`` attributes ``mode``, ``mul``, ``ka``, ``kb`` of ``kind`` for inputs
    with (scale, zero point) ``a`` and ``b`` (``signs``: the sign of each in a sum, ``(1, -1)``
    for a ``Sub``; ``count``: the divisor of a ``mean``), and the real multiplier of the
    requantization."""
    (sa, za), (sb, zb) = a, b
    attrs = {"za": int(za), "zb": int(zb)}
    if kind == "mul":
        return {**attrs, "mode": "sum", "mul": True, "ka": 0, "kb": 0}, sa * sb / out_scale
    unit = max(sa, sb) / ELTWISE_UNIT
    ka, kb = int(round(sa / unit)), int(round(sb / unit))
    if kind in ("add", "sub", "mean"):
        real = unit / out_scale / (count if kind == "mean" else 1)
        return {**attrs, "mode": "sum", "mul": False, "ka": signs[0] * ka,
                "kb": signs[1] * kb}, real
    return {**attrs, "mode": kind, "mul": False, "ka": ka, "kb": kb}, unit / out_scale


def quantize_eltwise(node: Node, params, qname, constants, types) -> Node:
    """``Eltwise`` {``kind``} -> ``QEltwise``: the operand of the output's shape first (the
    engine broadcasts its second operand; a ``Sub`` whose first operand is the broadcast one
    becomes ``-a + b``), the constants of :func:`eltwise_constants`, ``mult``/``shift`` per
    output channel."""
    kind = node.attrs["kind"]
    a, b = node.inputs[:2]
    out = node.outputs[0]
    signs = (1, -1) if kind == "sub" else (1, 1)
    if types[qname[a]].shape != types[qname[out]].shape:
        a, b, signs = b, a, signs[::-1]
    s_out, zp_out = params[out]
    attrs, real = eltwise_constants(kind, params[a], params[b], s_out, signs,
                                    int(node.attrs.get("count", 2)))
    channels = types[qname[out]].shape[1]
    mult, shift = requant_params(np.full(channels, real), node.name)
    names = add_constants(node.name, {"mult": mult, "shift": shift}, constants, types)
    lo, hi = clamp_bounds(node, params[out])
    return Node(node.name, "QEltwise", (qname[a], qname[b]) + names, (qname[out],),
                {**attrs, "kind": kind, "out_zp": zp_out, "lo": lo, "hi": hi,
                 "a_scale": params[a][0], "b_scale": params[b][0], "out_scale": s_out,
                 "relu": bool(node.attrs.get("relu"))})
