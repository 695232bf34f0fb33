"""Converters of the operators that only move or relabel values: ``Flatten``, ``Reshape``,
``Squeeze``/``Unsqueeze`` (a ``Reshape``), ``Identity`` and ``Dropout`` (an ``Identity``),
``Transpose`` (a ``Reshape`` when only size-1 axes move, else a ``Permute`` of a
``[1, C, H, W]`` image or the middle of a channel shuffle) and ``Concat`` of run-time
tensors."""

import math

import numpy as np
import onnx

from ..errors import ModelError
from ..ir.graph import Node
from ..passes.channel_shuffle import channel_order
from .builder import NO_ACTIVATION, GraphBuilder, check_unused, node_attrs, unsupported

__all__ = ["LAYOUT_CONVERTERS", "convert_identity", "transpose_is_reshape"]


def _flatten(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    axis = node_attrs(node).get("axis", 1)
    axis = axis + len(b.shape(x)) if axis < 0 else axis
    return Node(node.name, "Flatten", (x,), (b.value(node.output[0]),), {"axis": axis})


def _reshape(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    source = b.shape(x)
    target = [int(v) for v in b.onnx_constants[node.input[1]]]
    if not node_attrs(node).get("allowzero", 0):
        target = [source[i] if v == 0 else v for i, v in enumerate(target)]
    if -1 in target:
        known = math.prod(v for v in target if v != -1)
        target[target.index(-1)] = math.prod(source) // known if known else 0
    out = b.value(node.output[0])
    if tuple(target) != b.shape(out) or math.prod(target) != math.prod(source):
        raise ModelError(f"Reshape '{node.name}' resolves its shape to {target}, which does not "
                         f"match input {list(source)} and output {list(b.shape(out))}")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(target)})


def convert_identity(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Identity", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _dropout(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    check_unused(b, node, "the dropout mask")
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if training and bool(np.asarray(b.onnx_constants[training]).reshape(-1)[0]):
        raise ModelError(f"Dropout '{node.name}' must have training_mode false, not true; "
                         f"hwonnx runs inference only")
    return convert_identity(b, node)


def _as_reshape(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Squeeze``/``Unsqueeze`` (and a ``Transpose`` moving only size-1 axes): a ``Reshape``
    to the inferred output shape."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    if math.prod(b.shape(x)) != math.prod(b.shape(out)):
        raise ModelError(f"{node.op_type} '{node.name}' maps input {list(b.shape(x))} to output "
                         f"{list(b.shape(out))}, which has a different number of elements")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(b.shape(out))})


def transpose_is_reshape(shape: "tuple[int, ...]", perm: "list[int]") -> bool:
    """Whether ``perm`` keeps the relative order of the axes of size > 1 of ``shape`` (only
    size-1 axes move, so the data order is unchanged: a reshape)."""
    moved = [axis for axis in perm if shape[axis] != 1]
    return moved == sorted(moved)


def _transpose(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """A ``Reshape`` when only size-1 axes move; else a ``Permute`` of a ``[1, C, H, W]``
    image (the batch axis in place), which the ``fold-transpose`` pass removes where another
    cancels it or a ``Dense`` after a ``Flatten`` can take it into its weights, and the array
    copies otherwise."""
    x = b.value(node.input[0])
    shape = b.shape(x)
    perm = tuple(int(p) for p in node_attrs(node).get("perm", range(len(shape) - 1, -1, -1)))
    if transpose_is_reshape(shape, list(perm)):
        return _as_reshape(b, node)
    if (len(shape) != 4 or shape[0] != 1 or perm[0] != 0) \
            and not _in_channel_shuffle(b, node, perm):
        raise unsupported(b, node, (
            f"Transpose '{node.name}' has perm {list(perm)} on a value of shape {list(shape)}; "
            f"the array moves the channel, height and width axes of a [1, C, H, W] image"))
    return Node(node.name, "Permute", (x,), (b.value(node.output[0]),),
                {"perm": perm, **NO_ACTIVATION})


#: ONNX operators that only relabel the axes (mapped to ``Reshape``, ``Flatten`` or
#: ``Identity``), which a channel shuffle may have around its ``Transpose``.
_RELABELLING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def _in_channel_shuffle(b: GraphBuilder, node: onnx.NodeProto, perm) -> bool:
    """Whether the ``Transpose`` ``node`` is the middle of a channel shuffle: between
    relabelling nodes going from a ``[1, C, H, W]`` value to the next value of that shape,
    it permutes whole channels (:func:`hwonnx.passes.channel_shuffle.channel_order`; the
    ``channel-shuffle`` pass makes it one ``ChannelPermute``)."""
    def only_reader(value: str, reader: onnx.NodeProto) -> bool:
        readers = b.readers.get(value, [])
        return value not in b.outputs and len(readers) == 1 and readers[0] is reader

    source, reader = node.input[0], node
    while True:
        producer = b.producer.get(source)
        if producer is None or producer.op_type not in _RELABELLING \
                or not only_reader(source, reader):
            break
        source, reader = producer.input[0], producer
    shape, value, steps = b.shape(source), node.output[0], source != node.input[0]
    while b.shape(value) != shape or not steps:
        readers = b.readers.get(value, [])
        if not only_reader(value, readers[0] if readers else None) \
                or readers[0].op_type not in _RELABELLING or readers[0].input[0] != value:
            return False
        value, steps = readers[0].output[0], True
    return channel_order(shape, b.shape(node.input[0]), perm, shape) is not None


#: Names of the axes a ``Concat`` cannot join, by input rank.
_AXIS_NAMES = {4: ("batch", "channel", "height", "width"), 2: ("batch", "feature")}


def _concat(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Concat`` of run-time tensors: of ``[1, C_j, H, W]`` images along the channel, height
    or width axis, or of ``[1, K_j]`` vectors along axis 1 (a single input is an
    ``Identity``)."""
    constant = next((v for v in node.input if v in b.onnx_constants), None)
    if constant is not None:
        raise unsupported(b, node, (
            f"Concat '{node.name}' joins the constant '{constant}' to values computed at run "
            f"time; only run-time inputs can be concatenated"))
    xs = [b.value(v) for v in node.input]
    out = b.value(node.output[0])
    shape = b.shape(xs[0])
    rank = len(shape)
    axis = int(node_attrs(node).get("axis", 1))     # required (shape inference checks it)
    if not -rank <= axis < rank:
        raise ModelError(f"Concat '{node.name}' has axis={axis}, out of range for its rank-{rank} "
                         f"inputs")
    axis = axis + rank if axis < 0 else axis
    if rank not in _AXIS_NAMES or shape[0] != 1:
        raise unsupported(b, node, (
            f"Concat '{node.name}' joins values of shape {list(shape)}; only [1, C, H, W] "
            f"images and [1, K] vectors can be concatenated"))
    if axis == 0 or (rank == 2 and axis != 1):
        raise unsupported(b, node, (
            f"Concat '{node.name}' along axis {axis} ({_AXIS_NAMES[rank][axis]}) has no "
            f"hardware mapping; only the channel, height and width axes are supported"))
    if len(xs) == 1:
        return Node(node.name, "Identity", (xs[0],), (out,))
    return Node(node.name, "Concat", xs, (out,), {"axis": axis, **NO_ACTIVATION})


LAYOUT_CONVERTERS = {
    "Flatten": _flatten, "Reshape": _reshape, "Identity": convert_identity,
    "Dropout": _dropout, "Squeeze": _as_reshape, "Unsqueeze": _as_reshape,
    "Transpose": _transpose, "Concat": _concat,
}
