"""Quantization of the residual ``Add`` (two computed tensors of one shape).

With the element-wise engine (``ArchConfig.eltwise``) the sum is a ``QEltwise`` of kind ``add``:
each input keeps its own scale and zero point, weighted by integers in the ratio of the scales
to ``2**-17`` (``hwonnx/quant/eltwise.py``), and the result is requantized once, as the QDQ
float semantics define it. The quantizer always writes that form. An architecture without the
engine, or an ``Add`` whose operand is a reshaped tensor the engine cannot read in order, takes
the array's form instead, :func:`adds_on_array`: a ``QAdd``, a 1x1 convolution over both inputs
with int8 weights in the ratio of the scales (rounded to steps of 1/127, so less precise). See
``docs/arithmetic.md``, "Residual Add".
"""

import math
from dataclasses import replace

import numpy as np

from ..errors import QuantizationError
from ..ir import Graph, Node
from ..ir.ops import LAYOUT, ir_ops
from .eltwise import quantize_eltwise
from .params import add_constants, requant_params

__all__ = ["quantize_residual_add", "adds_on_array", "add_weights"]

_LAYOUT_OPS = ir_ops(LAYOUT)
#: ``QEltwise`` attributes a ``QAdd`` has no use for.
_ENGINE_ATTRS = ("kind", "mode", "mul", "ka", "kb", "exact")


def quantize_residual_add(node: Node, params, qname, constants, types, exact: bool) -> Node:
    """The float ``Add`` of two computed tensors -> ``QEltwise`` {kind ``add``}; ``exact``
    (every parameter given by a pre-quantized model) is kept for :func:`adds_on_array`."""
    q = quantize_eltwise(node.with_attrs(kind="add"), params, qname, constants, types)
    return q.with_attrs(exact=exact)


def _image_order(shape) -> "tuple[int, int]":
    """(channels, pixels) of a ``[1, C, H, W]`` image or ``[1, K]`` vector (K channels)."""
    return (shape[1], math.prod(shape[2:])) if len(shape) == 4 else (math.prod(shape[1:]), 1)


def _reshaped(graph: Graph, value: str) -> bool:
    """Whether ``value`` comes through layout ops from a tensor whose channels and pixels are
    another split of the same data (a flattened image, an image made of a vector): a tensor
    the element-wise engine cannot read in its natural order."""
    node = graph.producer(value)
    while node is not None and node.op in _LAYOUT_OPS:
        source = node.inputs[0]
        if _image_order(graph.types[source].shape) != _image_order(graph.types[value].shape):
            return True
        node = graph.producer(source)
    return False


def adds_on_array(graph: Graph, engine: bool) -> Graph:
    """``graph`` with each ``QEltwise`` sum of two equal shapes (a residual ``Add``, a link of
    a ``Sum``) made a ``QAdd`` on the array where the element-wise engine cannot take it: on an
    architecture without the engine (``engine`` False), or where an operand is reshaped."""
    nodes, constants, types = [], dict(graph.constants), dict(graph.types)
    for node in graph.nodes:
        a, b = node.inputs[:2] if node.op == "QEltwise" else (None, None)
        if node.op != "QEltwise" or node.attrs["kind"] != "add" \
                or graph.types[a].shape != graph.types[b].shape \
                or (engine and not (_reshaped(graph, a) or _reshaped(graph, b))):
            nodes.append(node)
            continue
        for name in node.inputs[2:]:
            del constants[name], types[name]
        nodes.append(array_add(node, constants, types))
    if len(nodes) == len(graph.nodes) and all(n is m for n, m in zip(nodes, graph.nodes)):
        return graph
    return replace(graph, nodes=tuple(nodes), constants=constants, types=types)


def _named(value: str) -> str:
    """The model's name of the int8 value ``value`` (``<name>:q``)."""
    return value.removesuffix(":q")


def array_add(node: Node, constants, types) -> Node:
    """The ``QAdd`` of the ``QEltwise`` sum ``node``: both inputs are rescaled by int8 weights
    in the ratio of their scales (the larger gets 127; with ``exact``, the model's own
    parameters, the pair of weights that best fits the two scales, see :func:`add_weights`),
    summed exactly and requantized once."""
    attrs = node.attrs
    a, b = node.inputs[:2]
    sa, sb, s_out = attrs["a_scale"], attrs["b_scale"], attrs["out_scale"]
    (small, v_small), (large, v_large) = sorted(((sa, _named(a)), (sb, _named(b))))
    if 127 * small < 0.5 * large:
        raise QuantizationError(
            f"Add '{node.name}': input '{v_small}' has scale {small:.4g}, {large / small:.0f}x "
            f"smaller than input '{v_large}' ({large:.4g}); without the element-wise engine "
            f"the array weights the two inputs by int8 integers in that ratio, so '{v_small}' "
            f"would get weight 0 and vanish (use an architecture with ArchConfig.eltwise)")
    za, zb = attrs["za"], attrs["zb"]
    if attrs.get("exact"):
        wa, wb, real = add_weights(sa / s_out, sb / s_out, za, zb)
    else:
        largest = max(sa, sb)
        wa, wb = int(round(127 * sa / largest)), int(round(127 * sb / largest))
        real = largest / 127 / s_out
    channels = types[a].shape[1]
    mult, shift = requant_params(np.full(channels, real), node.name)
    names = add_constants(node.name, {"mult": mult, "shift": shift}, constants, types)
    kept = {k: v for k, v in attrs.items() if k not in _ENGINE_ATTRS}
    return Node(node.name, "QAdd", (a, b) + names, node.outputs, {**kept, "wa": wa, "wb": wb})


def add_weights(ra: float, rb: float, za: int, zb: int) -> "tuple[int, int, float]":
    """Integer weights ``wa``, ``wb`` in ``[1, 127]`` and a real multiplier ``m`` such that
    ``m * (wa * A + wb * B)`` best approximates ``ra * A + rb * B`` for every int8 ``a``,
    ``b`` (``A = a - za``, ``B = b - zb``): the largest possible error,
    ``|A|max * |wa m - ra| + |B|max * |wb m - rb|``, is smallest (ties: larger weights)."""
    span_a, span_b = max(abs(-128 - za), abs(127 - za)), max(abs(-128 - zb), abs(127 - zb))
    best = None
    for wa in range(1, 128):
        for wb in {math.floor(wa * rb / ra), math.ceil(wa * rb / ra)}:
            if not 1 <= wb <= 127:
                continue
            for m in (ra / wa, rb / wb):
                error = span_a * abs(wa * m - ra) + span_b * abs(wb * m - rb)
                key = (error, -(wa + wb))
                if best is None or key < best[0]:
                    best = (key, wa, wb, m)
    if best is None:                      # a ratio beyond 127: the smaller weight rounds to 1
        wa, wb = (127, 1) if ra > rb else (1, 127)
        return wa, wb, max(ra, rb) / 127
    return best[1], best[2], best[3]
