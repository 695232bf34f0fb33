"""Binary element-wise operators between two computed tensors (``Add`` of two shapes, ``Sub``,
``Mul``, ``Max``, ``Min``, ``Sum``, ``Mean``): the float IR op ``Eltwise``, which the element-wise
engine computes (``hdl/eltwise.py``; ``docs/arithmetic.md``, "Element-wise operators")."""

import math

import numpy as np
import onnx

from ..errors import UnsupportedOperatorError
from ..ir.graph import Node, TensorType
from ..passes.rewrite import channel_scale_node, channel_weight

__all__ = ["ELTWISE_ONNX_OPS", "convert_eltwise", "convert_prelu", "eltwise_shapes"]

#: The ONNX operators :func:`convert_eltwise` maps, and the ``kind`` of each.
ELTWISE_ONNX_OPS = {"Add": "add", "Sub": "sub", "Mul": "mul", "Max": "max", "Min": "min",
                    "Sum": "add", "Mean": "mean"}


def _refuse(b, node: onnx.NodeProto, reason: str) -> UnsupportedOperatorError:
    return UnsupportedOperatorError.with_reasons([(node.name, node.op_type, "", b.opset)],
                                                 [reason])


def eltwise_shapes(a: "tuple[int, ...]", c: "tuple[int, ...]") -> "str | None":
    """Why the engine cannot combine values of shapes ``a`` and ``c`` (None when it can):
    equal ``[1, C, H, W]`` or ``[1, K]`` shapes, or an image and a per-channel ``[1, C, 1, 1]``
    tensor (right-aligned, as NumPy broadcasts), in either order."""
    a, c = tuple(a), tuple(c)
    if a == c and len(a) in (2, 4) and a[0] == 1:
        return None
    image, other = (a, c) if (len(a), math.prod(a)) >= (len(c), math.prod(c)) else (c, a)
    padded = (1,) * (len(image) - len(other)) + other
    if len(image) == 4 and image[0] == 1 and padded == (1, image[1], 1, 1):
        return None
    if len(image) == 4 and all(d == 1 for d in padded):
        return "a scalar broadcast over an image (only a per-channel [1, C, 1, 1] tensor is)"
    return "shapes the engine does not broadcast"


def _chain(b, node: onnx.NodeProto, inputs: "list[str]", out: str) -> "list[Node]":
    """A ``Sum``/``Mean`` of ``n > 2`` inputs as ``n - 1`` two-input sums, the partial sums
    ``<out>:sum<i>`` (each calibrated and requantized like any value), the last one divided
    by ``n`` for a ``Mean`` (``kind`` ``mean``, ``count`` ``n``)."""
    nodes, acc = [], b.value(inputs[0])
    for i, value in enumerate(inputs[1:], 1):
        x = b.value(value)
        why = eltwise_shapes(b.shape(acc), b.shape(x))
        if why is not None or value in b.onnx_constants:
            raise _refuse(b, node, f"{node.op_type} '{node.name}' adds '{value}' of shape "
                                   f"{list(b.shape(x))} to values of shape "
                                   f"{list(b.shape(acc))}: "
                                   f"{why or 'a constant'}; the element-wise engine sums "
                                   f"computed tensors of equal shapes or an image and "
                                   f"[1, C, 1, 1] tensors")
        last = i == len(inputs) - 1
        shape = max(b.shape(acc), b.shape(x), key=math.prod)
        name = out if last else f"{out}:sum{i}"
        if not last:
            b.types[name] = TensorType("float32", tuple(shape))
        kind = "mean" if last and node.op_type == "Mean" else "add"
        attrs = {"kind": kind, "relu": False, "act_max": None}
        if kind == "mean":
            attrs["count"] = len(inputs)
        nodes.append(Node(node.name if last else f"{node.name}:sum{i}", "Eltwise", (acc, x),
                          (name,), attrs))
        acc = name
    return nodes


def _spread_scalar(b, node: onnx.NodeProto, a: str, c: str
                   ) -> "tuple[Node, str, str] | None":
    """A computed ``[1, 1, 1, 1]`` scalar beside a ``[1, C, H, W]`` image, spread to ``[1, C, 1,
    1]`` by a 1x1 ``Conv`` with weights of one that copies it exactly (``copy``: it keeps its
    input's quantization), so the engine's per-channel broadcast takes it: ``(that Conv, the
    operands in their order)``; None for other shapes."""
    scalar = next((v for v in (a, c) if tuple(b.shape(v)) == (1, 1, 1, 1)), None)
    image = c if scalar == a else a
    if scalar is None or len(b.shape(image)) != 4:
        return None
    channels = b.shape(image)[1]
    spread = b.new_value(f"{scalar}:per_channel", (1, channels, 1, 1))
    weight = b.new_constant(f"{node.name}_spread", np.ones((channels, 1, 1, 1), np.float32))
    conv = Node(f"{node.name}:spread", "Conv", (scalar, weight), (spread,),
                {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1,
                 "relu": False, "act_max": None, "copy": True})
    return conv, *((spread, image) if scalar == a else (image, spread))


def convert_eltwise(b, node: onnx.NodeProto) -> "Node | list[Node]":
    """An ``Eltwise`` node {``kind``, ``relu``, ``act_max``} of the two run-time inputs of
    ``node`` (a one-input ``Sum``/``Mean``/``Max``/``Min`` is an ``Identity``)."""
    inputs = [v for v in node.input if v]
    out = b.value(node.output[0])
    if len(inputs) == 1 and node.op_type in ("Sum", "Mean", "Max", "Min"):
        return Node(node.name, "Identity", (b.value(inputs[0]),), (out,))
    if len(inputs) > 2 and node.op_type in ("Sum", "Mean"):
        return _chain(b, node, inputs, out)
    if len(inputs) != 2:
        raise _refuse(b, node, f"{node.op_type} '{node.name}' has {len(inputs)} inputs; the "
                               f"element-wise engine combines two")
    constant = [v for v in inputs if v in b.onnx_constants]
    if constant:
        raise _refuse(b, node, f"{node.op_type} '{node.name}' combines the constant "
                               f"'{constant[0]}' with a computed tensor; the element-wise "
                               f"engine maps {node.op_type} of two computed tensors only")
    a, c = (b.value(v) for v in inputs)
    why = eltwise_shapes(b.shape(a), b.shape(c))
    spread = _spread_scalar(b, node, a, c) if why is not None and why.startswith("a scalar") \
        else None
    if spread is not None:
        conv, a, c = spread
        return [conv, Node(node.name, "Eltwise", (a, c), (out,),
                           {"kind": ELTWISE_ONNX_OPS[node.op_type], "relu": False,
                            "act_max": None})]
    if why is not None:
        raise _refuse(b, node, f"{node.op_type} '{node.name}' combines '{a}' of shape "
                               f"{list(b.shape(a))} and '{c}' of shape {list(b.shape(c))}: "
                               f"{why}; the element-wise engine takes equal [1, C, H, W] or "
                               f"[1, K] shapes, or an image and a [1, C, 1, 1] tensor")
    return Node(node.name, "Eltwise", (a, c), (out,),
                {"kind": ELTWISE_ONNX_OPS[node.op_type], "relu": False, "act_max": None})


def convert_prelu(b, node: onnx.NodeProto) -> "Node | list[Node]":
    """``PRelu(x, slope)`` with a constant slope: one slope for every element is the table
    ``LeakyRelu`` (its ``alpha``); a slope per channel (``[C]``, ``[C, 1, 1]`` or ``[1, C, 1,
    1]`` on an image, ``[K]`` on a vector), every one in ``[0, 1]``, is ``max(x, slope * x)``:
    a per-channel scale (a depthwise 1x1 ``Conv`` or a diagonal ``Dense``) and an ``Eltwise``
    ``max`` on the element-wise engine, exact for such slopes. Others are refused by name."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    shape = b.shape(x)
    slope = np.asarray(b.array(node, node.input[1]), np.float64)
    if slope.size and np.all(slope == slope.reshape(-1)[0]):
        return Node(node.name, "LeakyRelu", (x,), (out,), {"alpha": float(slope.reshape(-1)[0])})
    channels = shape[1] if len(shape) in (2, 4) and shape[0] == 1 else None
    per_channel = channels is not None and slope.size == channels and \
        slope.shape in ((channels,), (channels, 1, 1), (1, channels, 1, 1), (1, channels)) and \
        (len(shape) == 4 or slope.ndim <= 2)
    if not per_channel or slope.min() < 0 or slope.max() > 1:
        raise _refuse(b, node, f"PRelu '{node.name}' has a slope of shape {list(slope.shape)} "
                               f"(from {slope.min():g} to {slope.max():g}) on '{x}' of shape "
                               f"{list(shape)}; hwonnx maps one slope (a LeakyRelu table) or "
                               f"one per channel in [0, 1] (max(x, slope x) on the element-wise "
                               f"engine)")
    weight = b.new_constant(f"{node.input[1]}_per_channel",
                            channel_weight(shape, slope.reshape(-1)))
    scaled = b.new_value(f"{out}:sloped", shape)
    scale = channel_scale_node(f"{node.name}:slope", (x, weight), scaled, shape)
    return [scale, Node(node.name, "Eltwise", (x, scaled), (out,),
                        {"kind": "max", "relu": False, "act_max": None})]
