"""Converters of ``Slice``, ``Split`` and ``Gather`` on run-time values: all become float
``Slice`` nodes (one per ``Split`` output; a ``Gather`` of consecutive indices with a
``Reshape`` after it), a window of unit steps along the channel, height and width axes of
a ``[1, C, H, W]`` image or along the features of a ``[1, K]`` vector: ``starts`` gives its
first index along each of those axes, its output shape the rest."""

import numpy as np
import onnx

from ..errors import ModelError
from ..ir.graph import Node
from .builder import NO_ACTIVATION, GraphBuilder, node_attrs, unsupported

__all__ = ["SLICING_CONVERTERS", "pad_by_copies"]


def _image_or_vector(b: GraphBuilder, node: onnx.NodeProto, x: str) -> "tuple[int, ...]":
    shape = b.shape(x)
    if len(shape) not in (2, 4) or shape[0] != 1:
        raise unsupported(b, node, (
            f"{node.op_type} '{node.name}' slices a value of shape {list(shape)}; only [1, C, "
            f"H, W] images and [1, K] vectors can be sliced"))
    return shape


def _slice_node(name: str, x: str, out: str, starts: "list[int]", shape) -> Node:
    return Node(name, "Slice", (x,), (out,), {"starts": tuple(int(s) for s in starts[1:]),
                                              "in_shape": tuple(shape), **NO_ACTIVATION})


def _ints(b: GraphBuilder, node: onnx.NodeProto, index: int, attrs: dict, key: str):
    if b.opset < 10:
        return list(attrs.get(key, [])) if key in attrs else None
    if len(node.input) > index and node.input[index]:
        return [int(v) for v in np.asarray(b.onnx_constants[node.input[index]]).reshape(-1)]
    return None


def _slice(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    out = b.value(node.output[0])
    shape = _image_or_vector(b, node, x)
    attrs = node_attrs(node)
    starts, ends = _ints(b, node, 1, attrs, "starts"), _ints(b, node, 2, attrs, "ends")
    axes = _ints(b, node, 3, attrs, "axes") or list(range(len(starts)))
    steps = _ints(b, node, 4, attrs, "steps") or [1] * len(starts)
    first = [0] * len(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis += len(shape) if axis < 0 else 0
        if step != 1:
            raise unsupported(b, node, f"Slice '{node.name}' has step {step} along axis "
                                       f"{axis}; only unit steps are supported")
        dim = shape[axis]
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if axis == 0 and (start, end) != (0, 1):
            raise unsupported(b, node, f"Slice '{node.name}' slices the batch axis")
        first[axis] = start
    if any(f + o > s for f, o, s in zip(first, b.shape(out), shape)):
        raise ModelError(f"Slice '{node.name}' reads beyond its input of shape {list(shape)}")
    return _slice_node(node.name, x, out, first, shape)


def _split(b: GraphBuilder, node: onnx.NodeProto) -> "list[Node]":
    x = b.value(node.input[0])
    shape = _image_or_vector(b, node, x)
    axis = int(node_attrs(node).get("axis", 0))
    axis += len(shape) if axis < 0 else 0
    if axis == 0:
        raise unsupported(b, node, f"Split '{node.name}' splits the batch axis")
    nodes, start = [], 0
    for index, name in enumerate(node.output):
        out = b.value(name)
        first = [0] * len(shape)
        first[axis] = start
        nodes.append(_slice_node(f"{node.name}/{index}", x, out, first, shape))
        start += b.shape(out)[axis]
    return nodes


def _sources(mode: str, length: int, before: int, after: int) -> "list[int] | None":
    """The input index each padded position along an axis copies (None: the pads are too large
    for ``reflect``, which mirrors without repeating the edge)."""
    if mode == "reflect" and max(before, after) > length - 1:
        return None
    result = []
    for i in range(-before, length + after):
        if mode == "edge":
            result.append(min(max(i, 0), length - 1))
        elif mode == "wrap":
            result.append(i % length)
        else:                                           # reflect
            result.append(-i if i < 0 else 2 * (length - 1) - i if i >= length else i)
    return result


def _runs(indices: "list[int]") -> "list[tuple[int, int]]":
    """``(start, length)`` of the runs of consecutive increasing indices."""
    runs = []
    for i in indices:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def pad_by_copies(b: GraphBuilder, node: onnx.NodeProto, x: str, out: str, full: "list[int]",
                  mode: str) -> "list[Node]":
    """``Pad`` in mode ``reflect``, ``edge`` or ``wrap`` of the height and width of a ``[1, C,
    H, W]`` image: along each padded axis, the runs of input rows (columns) the padded tensor
    copies are ``Slice`` nodes joined by a ``Concat`` (a run repeated is one ``Slice`` read
    twice), so the array copies them exactly."""
    shape = b.shape(x)
    rank = len(shape)
    if rank != 4 or any(p < 0 for p in full) or any(full[a] or full[a + rank] for a in (0, 1)):
        raise unsupported(b, node, (
            f"Pad '{node.name}' pads a {rank}-D input by {full} in mode '{mode}'; only "
            f"non-negative pads of the two spatial axes of a 4-D input are copied"))
    nodes, current, current_shape = [], x, list(shape)
    padded = [axis for axis in (2, 3) if full[axis] or full[axis + rank]]
    for axis in padded:
        sources = _sources(mode, current_shape[axis], full[axis], full[axis + rank])
        if sources is None:
            raise unsupported(b, node, (
                f"Pad '{node.name}' reflects {full[axis]} and {full[axis + rank]} positions "
                f"along axis {axis}, of size {current_shape[axis]}; reflect pads must be "
                f"smaller than the size"))
        pieces, made = [], {}
        for start, length in _runs(sources):
            if (start, length) == (0, current_shape[axis]):
                pieces.append(current)
                continue
            if (start, length) not in made:
                piece_shape = list(current_shape)
                piece_shape[axis] = length
                name = b.new_value(f"{out}:{'hw'[axis - 2]}{start}+{length}", piece_shape)
                first = [0, 0, 0, 0]
                first[axis] = start
                nodes.append(_slice_node(f"{node.name}/{'hw'[axis - 2]}{start}+{length}",
                                         current, name, first, current_shape))
                made[start, length] = name
            pieces.append(made[start, length])
        current_shape[axis] = len(sources)
        target = out if axis == padded[-1] else b.new_value(f"{out}:h", current_shape)
        nodes.append(Node(f"{node.name}/{'hw'[axis - 2]}" if axis != padded[-1] else node.name,
                          "Concat", tuple(pieces), (target,), {"axis": axis, **NO_ACTIVATION}))
        current = target
    return nodes


def _gather(b: GraphBuilder, node: onnx.NodeProto) -> "list[Node]":
    """``Gather`` of a computed tensor by constant indices that are a run of consecutive
    increasing positions (a vision transformer's class token ``x[:, 0]``): a ``Slice`` of the
    run, then a ``Reshape`` to the output's shape where the indices are a scalar (the axis
    dropped) or of rank above 1."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    shape = b.shape(x)
    axis = int(node_attrs(node).get("axis", 0))
    axis += len(shape) if axis < 0 else 0
    indices = np.asarray(b.onnx_constants[node.input[1]])
    picked = [int(i) + (shape[axis] if i < 0 else 0) for i in indices.reshape(-1)]
    if not picked or _runs(picked) != [(picked[0], len(picked))]:
        raise unsupported(b, node, (
            f"Gather '{node.name}' picks indices {indices.reshape(-1).tolist()[:8]} along axis "
            f"{axis}; only a run of consecutive increasing indices (a Slice) is mapped"))
    if not 0 <= picked[0] <= picked[-1] < shape[axis]:
        bad = int(indices.reshape(-1)[0 if picked[0] < 0 else -1])
        raise ModelError(f"Gather '{node.name}' reads index {bad} along axis {axis} of its "
                         f"input of shape {list(shape)}; ONNX takes indices in [-{shape[axis]}, "
                         f"{shape[axis] - 1}]")
    if axis == 0:
        raise unsupported(b, node, f"Gather '{node.name}' picks along the batch axis")
    _image_or_vector(b, node, x)
    sliced = list(shape)
    sliced[axis] = len(picked)
    if tuple(sliced) == b.shape(out):
        target, nodes = out, []
    else:
        target = b.new_value(f"{out}:slice", sliced)
        nodes = [Node(f"{node.name}/reshape", "Reshape", (target,), (out,),
                      {"shape": tuple(b.shape(out))})]
    first = [0] * len(shape)
    first[axis] = picked[0]
    return [_slice_node(node.name, x, target, first, shape), *nodes]


SLICING_CONVERTERS = {"Slice": _slice, "Split": _split, "Gather": _gather}
