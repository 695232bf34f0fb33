"""Unary functions that exporters write as several nodes, recognised as one table operator:

* ``x * Sigmoid(x)`` (PyTorch's SiLU): ``Swish`` with ``alpha = 1``;
* ``x * HardSigmoid(x)``: ``HardSwish`` when ``alpha = 1/6, beta = 0.5``, else the float IR's
  ``XHardSigmoid``;
* ``x * Clip(x + 3, 0, 6) / 6`` (Keras/TF's hard-swish; ``Div`` by 6 or ``Mul`` by 1/6):
  ``HardSwish``;
* ``x * (1 + Erf(x / sqrt(2))) * 0.5`` (PyTorch's GELU before opset 20; ``Div`` by sqrt(2) or
  ``Mul`` by 1/sqrt(2)): ``Gelu``; ``x * (1 + Tanh(sqrt(2/pi) (x + 0.044715 x^3))) * 0.5``
  (its tanh approximation; x^3 as ``Pow`` or ``x * (x * x)``): ``Gelu`` with ``tanh``;
* ``x * Tanh(Softplus(x))``: ``Mish``.

Each becomes one 256-entry table, exact for the function (one rounding) instead of a chain of
int8 steps; the nodes inside the pattern must be read only by the pattern (the result may be
read by anything). The frontend runs this before the support check: the support check skips
the inner nodes and the converter makes one node of the table operator from the last one.
"""

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir.graph import Node
from ..ir.tables import TABLE_OPS
from .common import is_default_domain

__all__ = ["Fused", "find_unary_patterns", "pattern_converters"]


@dataclass(frozen=True)
class Fused:
    """A recognised pattern: table operator ``op`` with ``attrs`` on ``x``, written to the
    output of node ``last``; ``inner`` names every node of the pattern (``last`` too)."""
    op: str
    attrs: dict
    x: str
    last: str
    inner: "frozenset[str]"


class _Graph:
    def __init__(self, graph: onnx.GraphProto):
        self.producer = {v: n for n in graph.node for v in n.output if v}
        self.readers: "dict[str, list]" = {}
        for node in graph.node:
            for value in set(node.input):
                self.readers.setdefault(value, []).append(node)
        self.outputs = {v.name for v in graph.output}
        self.constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and is_default_domain(node.domain):
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = numpy_helper.to_array(attr.t)
                    elif attr.name in ("value_float", "value_int"):
                        self.constants[node.output[0]] = np.asarray(
                            onnx.helper.get_attribute_value(attr))

    def node(self, value: str, op: str, inner: "list") -> "onnx.NodeProto | None":
        """The producer of ``value`` if it is an ``op`` node read only by the pattern (so it
        can disappear into it), appended to ``inner``."""
        node = self.producer.get(value)
        if node is None or node.op_type != op or not is_default_domain(node.domain) \
                or value in self.outputs or len(self.readers.get(value, ())) != 1:
            return None
        inner.append(node)
        return node

    def scalar(self, value: str) -> "float | None":
        array = self.constants.get(value)
        if array is None or array.size != 1 or array.dtype.kind != "f":
            return None
        return float(array.reshape(-1)[0])

    def operands(self, node) -> "tuple[str, float] | None":
        """``(run-time operand, constant)`` of a binary node with one scalar constant."""
        if len(node.input) != 2:
            return None
        for a, b in (node.input, node.input[::-1]):
            if a not in self.constants and self.scalar(b) is not None:
                return a, self.scalar(b)
        return None


def _close(value: "float | None", target: float) -> bool:
    return value is not None and math.isclose(value, target, rel_tol=1e-6)


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _times(g: _Graph, node) -> "tuple[str, float] | None":
    """``(value, factor)`` of ``value * factor`` or ``value / (1 / factor)``."""
    pair = g.operands(node)
    if pair is None or node.op_type not in ("Mul", "Div"):
        return None
    value, c = pair
    if node.op_type == "Div":
        if node.input[0] != value or not c:       # value / c, not c / value
            return None
        c = 1.0 / c
    return value, c


def _relu6_of_x_plus_3(g: _Graph, value: str, x: str, inner: list) -> bool:
    """Whether ``value`` is ``Clip(x + 3, 0, 6)`` (nodes appended to ``inner``)."""
    clip = g.node(value, "Clip", inner)
    if clip is None:
        return False
    lo = g.scalar(clip.input[1]) if len(clip.input) > 1 and clip.input[1] else \
        _attr(clip, "min", None)
    hi = g.scalar(clip.input[2]) if len(clip.input) > 2 and clip.input[2] else \
        _attr(clip, "max", None)
    add = g.node(clip.input[0], "Add", inner)
    pair = add is not None and g.operands(add)
    return bool(pair) and pair[0] == x and _close(pair[1], 3.0) and _close(lo, 0.0) \
        and _close(hi, 6.0)


def _match_mul(g: _Graph, mul) -> "Fused | None":
    """``x * gate(x)``: SiLU, x * hardsigmoid, Mish, x * (relu6(x + 3) / 6)."""
    if len(mul.input) != 2:                 # malformed: the signature check names it
        return None
    for x, gate in (mul.input, mul.input[::-1]):
        inner = [mul]
        names = lambda: frozenset(n.name for n in inner)           # noqa: E731
        sig = g.node(gate, "Sigmoid", inner)
        if sig is not None and sig.input[0] == x:
            return Fused("Swish", {"alpha": 1.0}, x, mul.name, names())
        inner[1:] = []
        hs = g.node(gate, "HardSigmoid", inner)
        if hs is not None and hs.input[0] == x:
            alpha, beta = float(_attr(hs, "alpha", 0.2)), float(_attr(hs, "beta", 0.5))
            if _close(alpha, 1 / 6) and _close(beta, 0.5):
                return Fused("HardSwish", {}, x, mul.name, names())
            return Fused("XHardSigmoid", {"alpha": alpha, "beta": beta}, x, mul.name, names())
        inner[1:] = []
        tanh = g.node(gate, "Tanh", inner)
        soft = tanh is not None and g.node(tanh.input[0], "Softplus", inner)
        if soft and soft.input[0] == x:
            return Fused("Mish", {}, x, mul.name, names())
        inner[1:] = []
        div = g.producer.get(gate)
        if div is not None and div.op_type in ("Div", "Mul") and g.node(gate, div.op_type,
                                                                         inner):
            scaled = _times(g, div)
            if scaled and _close(scaled[1], 1 / 6) and \
                    _relu6_of_x_plus_3(g, scaled[0], x, inner):
                return Fused("HardSwish", {}, x, mul.name, names())
    return None


def _tanh_gelu_inner(g: _Graph, value: str, x: str, inner: list) -> "list | None":
    """``inner`` with the nodes of ``tanh(sqrt(2 / pi) (x + 0.044715 x^3))`` writing
    ``value`` (x^3 as ``Pow(x, 3)`` or ``x * (x * x)``, as PyTorch writes it), else None."""
    tanh = g.node(value, "Tanh", inner)
    scaled = tanh is not None and g.producer.get(tanh.input[0])
    if not scaled or scaled.op_type not in ("Mul", "Div") or \
            not g.node(tanh.input[0], scaled.op_type, inner):
        return None
    pair = _times(g, scaled)
    if pair is None or not _close(pair[1], math.sqrt(2 / math.pi)):
        return None
    add = g.node(pair[0], "Add", inner)
    if add is None or len(add.input) != 2 or x not in add.input:
        return None
    cubic = next(v for v in add.input if v != x) if add.input[0] != add.input[1] else None
    term = cubic and g.producer.get(cubic)
    if not term or term.op_type != "Mul" or not g.node(cubic, "Mul", inner):
        return None
    pair = _times(g, term)
    if pair is None or not _close(pair[1], 0.044715):
        return None
    cube = g.producer.get(pair[0])
    if cube is None or not g.node(pair[0], cube.op_type, inner):
        return None
    if cube.op_type == "Pow" and cube.input[0] == x and _close(g.scalar(cube.input[1]), 3.0):
        return inner
    if cube.op_type == "Mul" and x in cube.input:
        square = next((v for v in cube.input if v != x), None)
        node = square and g.node(square, "Mul", inner)
        if node and list(node.input) == [x, x]:
            return inner
    return None


def _match_scaled(g: _Graph, last) -> "Fused | None":
    """The patterns ending in a constant factor: hard-swish ``(x * relu6(x + 3)) / 6`` and
    GELU ``(x * (1 + erf(x / sqrt 2))) * 0.5``."""
    scaled = _times(g, last)
    if scaled is None:
        return None
    value, factor = scaled
    inner = [last]
    mul = g.node(value, "Mul", inner)
    if mul is None or len(mul.input) != 2:
        return None
    for x, gate in (mul.input, mul.input[::-1]):
        tried = list(inner)
        if _close(factor, 1 / 6) and _relu6_of_x_plus_3(g, gate, x, tried):
            return Fused("HardSwish", {}, x, last.name, frozenset(n.name for n in tried))
        tried = list(inner)
        add = g.node(gate, "Add", tried)
        pair = add is not None and g.operands(add)
        if not _close(factor, 0.5) or not pair or not _close(pair[1], 1.0):
            continue
        if _tanh_gelu_inner(g, pair[0], x, list(tried)) is not None:
            tried = _tanh_gelu_inner(g, pair[0], x, tried)
            return Fused("Gelu", {"approximate": "tanh"}, x, last.name,
                         frozenset(n.name for n in tried))
        erf = g.node(pair[0], "Erf", tried)
        arg = erf is not None and g.producer.get(erf.input[0])
        if not arg or arg.op_type not in ("Div", "Mul") or \
                not g.node(erf.input[0], arg.op_type, tried):
            continue
        inside = _times(g, arg)
        if inside is not None and inside[0] == x and _close(inside[1], 1 / math.sqrt(2)):
            return Fused("Gelu", {"approximate": "none"}, x, last.name,
                         frozenset(n.name for n in tried))
    return None


def find_unary_patterns(graph: onnx.GraphProto) -> "dict[str, Fused]":
    """Every recognised pattern of ``graph`` (module docstring), by the name of its last
    node; patterns do not overlap (the first match of a node wins)."""
    g = _Graph(graph)
    found: "dict[str, Fused]" = {}
    taken: "set[str]" = set()
    for node in graph.node:
        if not is_default_domain(node.domain) or node.op_type not in ("Mul", "Div"):
            continue
        fused = _match_scaled(g, node) or (_match_mul(g, node) if node.op_type == "Mul"
                                          else None)
        if fused is not None and not fused.inner & taken:
            found[fused.last] = fused
            taken |= fused.inner
    # a pattern inside a larger one found later (x * sigmoid(x) within nothing) is dropped
    return {k: v for k, v in found.items()
            if not any(k in other.inner and other.last != k for other in found.values())}


def pattern_converters(patterns: "dict[str, Fused]") -> dict:
    """Converters (:func:`hwonnx.frontend.convert.convert_graph`'s ``special``) of the nodes
    of ``patterns``: the last one makes the table operator's node, the others nothing."""
    def last(fused: Fused):
        def convert(b, node):
            attrs = {**TABLE_OPS[fused.op].defaults, **fused.attrs}
            return Node(node.name, fused.op, (b.value(fused.x),), (b.value(node.output[0]),),
                        attrs)
        return convert

    converters = {}
    for fused in patterns.values():
        for name in fused.inner:
            converters[name] = last(fused) if name == fused.last else (lambda b, node: [])
    return converters
