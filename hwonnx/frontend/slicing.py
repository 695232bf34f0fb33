"""Converters of ``Slice`` and ``Split`` on run-time values: both become float ``Slice`` nodes
(one per ``Split`` output), a window of unit steps along the channel, height and width axes of
a ``[1, C, H, W]`` image or along the features of a ``[1, K]`` vector: ``starts`` gives its
first index along each of those axes, its output shape the rest."""

import numpy as np
import onnx

from ..errors import ModelError
from ..ir.graph import Node
from .builder import _ACTIVATION, _Builder, _attrs, _unsupported

__all__ = ["SLICING_CONVERTERS"]


def _image_or_vector(b: _Builder, node: onnx.NodeProto, x: str) -> "tuple[int, ...]":
    shape = b.shape(x)
    if len(shape) not in (2, 4) or shape[0] != 1:
        raise _unsupported(b, node, (
            f"{node.op_type} '{node.name}' slices a value of shape {list(shape)}; only [1, C, "
            f"H, W] images and [1, K] vectors can be sliced"))
    return shape


def _slice_node(name: str, x: str, out: str, starts: "list[int]", shape) -> Node:
    return Node(name, "Slice", (x,), (out,), {"starts": tuple(int(s) for s in starts[1:]),
                                              "in_shape": tuple(shape), **_ACTIVATION})


def _ints(b: _Builder, node: onnx.NodeProto, index: int, attrs: dict, key: str):
    if b.opset < 10:
        return list(attrs.get(key, [])) if key in attrs else None
    if len(node.input) > index and node.input[index]:
        return [int(v) for v in np.asarray(b.onnx_constants[node.input[index]]).reshape(-1)]
    return None


def _slice(b: _Builder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    out = b.value(node.output[0])
    shape = _image_or_vector(b, node, x)
    attrs = _attrs(node)
    starts, ends = _ints(b, node, 1, attrs, "starts"), _ints(b, node, 2, attrs, "ends")
    axes = _ints(b, node, 3, attrs, "axes") or list(range(len(starts)))
    steps = _ints(b, node, 4, attrs, "steps") or [1] * len(starts)
    first = [0] * len(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis += len(shape) if axis < 0 else 0
        if step != 1:
            raise _unsupported(b, node, f"Slice '{node.name}' has step {step} along axis "
                                        f"{axis}; only unit steps are supported")
        dim = shape[axis]
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if axis == 0 and (start, end) != (0, 1):
            raise _unsupported(b, node, f"Slice '{node.name}' slices the batch axis")
        first[axis] = start
    if any(f + o > s for f, o, s in zip(first, b.shape(out), shape)):
        raise ModelError(f"Slice '{node.name}' reads beyond its input of shape {list(shape)}")
    return _slice_node(node.name, x, out, first, shape)


def _split(b: _Builder, node: onnx.NodeProto) -> "list[Node]":
    x = b.value(node.input[0])
    shape = _image_or_vector(b, node, x)
    axis = int(_attrs(node).get("axis", 0))
    axis += len(shape) if axis < 0 else 0
    if axis == 0:
        raise _unsupported(b, node, f"Split '{node.name}' splits the batch axis")
    nodes, start = [], 0
    for index, name in enumerate(node.output):
        out = b.value(name)
        first = [0] * len(shape)
        first[axis] = start
        nodes.append(_slice_node(f"{node.name}/{index}", x, out, first, shape))
        start += b.shape(out)[axis]
    return nodes


SLICING_CONVERTERS = {"Slice": _slice, "Split": _split}
