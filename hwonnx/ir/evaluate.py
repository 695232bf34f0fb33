"""NumPy float32 reference evaluator of the float IR vocabulary (``Conv``, ``Dense``, ``Add``,
``AvgPool``, ``MaxPool``, ``Concat``, ``Relu``, ``Clip``, ``BatchNorm``, ``Flatten``, ``Reshape``,
``Identity``, ``Softmax``, and the elementwise table operators of :data:`.tables.TABLE_OPS`:
``LeakyRelu``, ``Sigmoid``, ``Tanh``, ``Elu``, ``Gelu``, ...).

Every node is held to the work bounds :data:`MAX_VALUE_ELEMENTS`, :data:`MAX_PATCH_ELEMENTS`
and :data:`MAX_NODE_MACS` (per sample, :func:`check_node_work`): the frontend refuses a model
that breaks one, and the evaluator extracts convolution and pooling windows a few samples at a
time, so that its memory does not grow with the batch.

The layer-like ops ``Conv``, ``Dense``, ``Add``, ``AvgPool``, ``MaxPool`` and ``Concat``
(channel axis) apply their fused activation after the op: ``max(y, 0)`` if ``relu``, then
``min(y, act_max)`` if ``act_max`` is set."""

import math
from typing import Callable, Mapping

import numpy as np

from ..errors import ResourceError
from ..golden.host import HOST_FUNCTIONS, run_host
from ..golden.im2col import conv_output_size, im2col
from ..golden.transposed import scatter
from .graph import Graph, Node, TensorType
from .ops import IR_OPS
from .tables import TABLE_OPS

__all__ = ["FLOAT_OPS", "TABLE_FUNCTIONS", "evaluate_float", "first_not_finite",
           "MAX_VALUE_ELEMENTS", "MAX_PATCH_ELEMENTS", "MAX_NODE_MACS", "node_work",
           "check_node_work"]

#: No value computed at run time (nor the padded input of a convolution or pooling) may have
#: more elements than this per sample: 64 MiB of float32 (a 1x64x512x512 feature map).
MAX_VALUE_ELEMENTS = 1 << 24
#: The windows a convolution or pooling node reads (the im2col patch matrix, output pixels x
#: input channels x kernel taps) may have at most this many elements per sample: 256 MiB of
#: float32, 512 MiB in the int64 golden arithmetic.
MAX_PATCH_ELEMENTS = 1 << 26
#: A node may take at most this many multiply-accumulates (or window taps, or elements) per
#: sample: about a second of NumPy.
MAX_NODE_MACS = 1 << 30
_WINDOWED = tuple(op for op, entry in IR_OPS.items() if entry.windowed)


def node_work(node: Node, types: "Mapping[str, TensorType]") -> "dict[str, int]":
    """Return the work of ``node`` per sample: ``padded`` (elements of its padded input, 0 for
    an op without windows), ``patches`` (elements of its im2col patch matrix, 0 likewise) and
    ``macs`` (multiply-accumulates, window taps, or output elements for an elementwise op).
    ``types`` gives the shape of every input and output (batch 1)."""
    out = types[node.outputs[0]].shape
    if node.op in _WINDOWED:
        _, c, h, w = types[node.inputs[0]].shape
        if node.op == "Conv":
            kernel, taps = types[node.inputs[1]].shape[2:], math.prod(
                types[node.inputs[1]].shape[1:])
        else:
            kernel = node.attrs["kernel"]
            taps = math.prod(kernel)
        top, left, bottom, right = node.attrs["pads"]
        return {"padded": c * (h + top + bottom) * (w + left + right),
                "patches": math.prod(out[2:]) * c * math.prod(kernel),
                "macs": math.prod(out) * taps}
    if node.op == "ConvTranspose":           # every input pixel meets every kernel tap
        return {"padded": 0, "patches": 0, "macs": math.prod(
            types[node.inputs[0]].shape[2:]) * math.prod(types[node.inputs[1]].shape)}
    if node.op == "Dense":
        return {"padded": 0, "patches": 0,
                "macs": math.prod(out) * types[node.inputs[0]].shape[-1]}
    return {"padded": 0, "patches": 0, "macs": math.prod(out)}


def check_node_work(node: Node, types: "Mapping[str, TensorType]") -> None:
    """Check ``node`` against the work bounds (see :func:`node_work`).

    Raises
    ------
    ResourceError
        If one of its outputs, its padded input, its patch matrix or its multiply-accumulates
        exceed :data:`MAX_VALUE_ELEMENTS`, :data:`MAX_PATCH_ELEMENTS` or
        :data:`MAX_NODE_MACS`; names the node and the size.
    """
    what = f"Node '{node.name}' ({node.op})"
    for value in node.outputs:
        count = types[value].size
        if count > MAX_VALUE_ELEMENTS:
            raise ResourceError(f"{what} computes '{value}' of shape "
                                f"{list(types[value].shape)}, {count} elements per sample, "
                                f"more than hwonnx's limit of {MAX_VALUE_ELEMENTS} for a value")
    work = node_work(node, types)
    if work["padded"] > MAX_VALUE_ELEMENTS:
        _, c, h, w = types[node.inputs[0]].shape
        top, left, bottom, right = node.attrs["pads"]
        raise ResourceError(f"{what} pads its input of shape {[1, c, h, w]} to "
                            f"{[1, c, h + top + bottom, w + left + right]}, {work['padded']} "
                            f"elements per sample, more than hwonnx's limit of "
                            f"{MAX_VALUE_ELEMENTS} for a value")
    if work["patches"] > MAX_PATCH_ELEMENTS:
        raise ResourceError(f"{what} reads windows of {work['patches']} elements per sample "
                            f"(output pixels x input channels x kernel taps), more than "
                            f"hwonnx's limit of {MAX_PATCH_ELEMENTS}")
    if work["macs"] > MAX_NODE_MACS:
        raise ResourceError(f"{what} takes {work['macs']} multiply-accumulates per sample, more "
                            f"than hwonnx's limit of {MAX_NODE_MACS}")


def _chunks(x: np.ndarray, per_sample: int) -> "list[np.ndarray]":
    """Split the batch ``x`` so that each part's windows hold at most
    :data:`MAX_PATCH_ELEMENTS` elements (``per_sample`` per sample)."""
    step = max(1, MAX_PATCH_ELEMENTS // max(per_sample, 1))
    return [x[i:i + step] for i in range(0, x.shape[0], step)] or [x]


def _batch(shape: "tuple[int, ...]", n: int) -> "tuple[int, ...]":
    """Return the target ``shape`` for a batch of ``n`` samples (leading 1 replaced by ``n``)."""
    if n == 1:
        return shape
    if not shape or shape[0] != 1:
        raise ValueError(f"Cannot evaluate a batch of {n} through a reshape to {list(shape)}, "
                         f"whose leading dimension is not 1")
    return (n, *shape[1:])


def _activation(node: Node, y: np.ndarray) -> np.ndarray:
    """Apply the fused ``relu`` and ``act_max`` of a layer-like node."""
    if node.attrs.get("relu"):
        y = np.maximum(y, 0)
    act_max = node.attrs.get("act_max")
    if act_max is not None:
        y = np.minimum(y, np.float32(act_max))
    return y


#: The binary element-wise operators of the float IR op ``Eltwise`` (attr ``kind``), float32.
ELTWISE_KINDS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "mean": np.add,
}


def _eltwise(graph: Graph, node: Node, a, b):
    y = ELTWISE_KINDS[node.attrs["kind"]](np.asarray(a, np.float32), np.asarray(b, np.float32))
    if node.attrs["kind"] == "mean":      # the last sum of a Mean of ``count`` inputs
        y = y / np.float32(node.attrs.get("count", 2))
    return _activation(node, np.asarray(y, np.float32))


def _conv(graph: Graph, node: Node, x, w, b=None):
    m, cg, kh, kw = w.shape
    group = node.attrs.get("group", 1)
    (sy, sx), (dy, dx) = node.attrs["strides"], node.attrs["dilations"]
    top, left, bottom, right = node.attrs["pads"]
    out_h = conv_output_size(x.shape[2], kh, sy, top, bottom, dy)
    out_w = conv_output_size(x.shape[3], kw, sx, left, right, dx)
    # The patch axis is ordered (c, ky, kx), so group g owns a contiguous slice of it.
    wg = w.reshape(group, 1, m // group, cg * kh * kw).transpose(0, 1, 3, 2)   # [G, 1, K, J]
    parts = []
    for part in _chunks(x, out_h * out_w * x.shape[1] * kh * kw):
        cols = im2col(part, (kh, kw), node.attrs["strides"], node.attrs["pads"],
                      node.attrs["dilations"], pad_value=node.attrs.get("pad_value", 0.0))
        n, length = cols.shape[:2]
        cols = cols.reshape(n, length, group, cg * kh * kw).transpose(2, 0, 1, 3)  # [G,N,L,K]
        y = (cols @ wg).transpose(1, 0, 3, 2)                                     # [N,G,J,L]
        parts.append(y.reshape(n, m, out_h, out_w))
    y = np.concatenate(parts) if len(parts) > 1 else parts[0]
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return _activation(node, y)


def _dense(graph: Graph, node: Node, x, w, b=None):
    y = x @ w
    if b is not None:
        y = y + b
    return _activation(node, y)


def _windows(node: Node, x: np.ndarray, pad_value, reduce) -> np.ndarray:
    """Reduce each pooling window of ``x`` with ``reduce(patches)`` (``patches``:
    ``[N, OH*OW, C, KH*KW]``), a few samples at a time; return ``[N, C, OH, OW]``."""
    kernel, strides = node.attrs["kernel"], node.attrs["strides"]
    pads, dilations = node.attrs["pads"], node.attrs.get("dilations", (1, 1))
    n, c, h, w = x.shape
    out_h = conv_output_size(h, kernel[0], strides[0], pads[0], pads[2], dilations[0])
    out_w = conv_output_size(w, kernel[1], strides[1], pads[1], pads[3], dilations[1])
    taps = kernel[0] * kernel[1]
    parts = []
    for part in _chunks(x, out_h * out_w * c * taps):
        patches = im2col(part, kernel, strides, pads, dilations, pad_value=pad_value)
        y = reduce(patches.reshape(part.shape[0], out_h * out_w, c, taps))
        parts.append(y.transpose(0, 2, 1).reshape(part.shape[0], c, out_h, out_w))
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _avgpool(graph: Graph, node: Node, x):
    total = _windows(node, x, node.attrs.get("pad_value", 0.0),
                     lambda p: p.sum(axis=-1, dtype=np.float32))
    if node.attrs["count_include_pad"]:
        count = np.float32(node.attrs["kernel"][0] * node.attrs["kernel"][1])
    else:                                     # the real (unpadded) pixels under each window
        inside = np.ones((1, 1) + x.shape[2:], np.float32)
        count = _windows(node, inside, 0.0, lambda p: p.sum(axis=-1, dtype=np.float32))
    return _activation(node, total / count)


def _maxpool(graph: Graph, node: Node, x):
    y = _windows(node, x, node.attrs.get("pad_value", -np.inf), lambda p: p.max(axis=-1))
    return _activation(node, y)


def _softmax(graph: Graph, node: Node, x):
    axis = node.attrs["axis"]
    if axis == 0 and graph.types[node.inputs[0]].shape[0] == 1:
        return np.ones_like(x)                # each sample of a batch is a softmax over 1 value
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _clip(graph: Graph, node: Node, x):
    low, high = node.attrs["min"], node.attrs["max"]
    if low is not None:
        x = np.maximum(x, np.float32(low))
    return x if high is None else np.minimum(x, np.float32(high))


def _batchnorm(graph: Graph, node: Node, x, scale, bias, mean, var):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    s = scale / np.sqrt(var + np.float32(node.attrs["epsilon"]))
    return (x - mean.reshape(shape)) * s.reshape(shape) + bias.reshape(shape)


def _reshape(graph: Graph, node: Node, x):
    return x.reshape(_batch(graph.types[node.outputs[0]].shape, x.shape[0]))


def _concat(graph: Graph, node: Node, *xs):
    """The inputs joined along ``axis``; a constant input (the class token a host ``Concat``
    joins to the tokens) is the same for every sample."""
    count = max(np.shape(x)[0] for x in xs)
    xs = [np.broadcast_to(x, (count, *np.shape(x)[1:])) if name in graph.constants else x
          for name, x in zip(node.inputs, xs)]
    return _activation(node, np.concatenate(xs, axis=node.attrs["axis"]))


def _slice(graph: Graph, node: Node, x):
    """The window of ``x`` from ``starts`` (one index per non-batch axis) of the output's
    shape."""
    out = graph.types[node.outputs[0]].shape[1:]
    window = tuple(slice(s, s + n) for s, n in zip(node.attrs["starts"], out))
    return _activation(node, x[(slice(None),) + window])


def _conv_transpose(graph: Graph, node: Node, x, w, b=None):
    """ONNX ConvTranspose (weights in convolution layout, :mod:`hwonnx.golden.transposed`)."""
    y = scatter(x, w, node.attrs["strides"], node.attrs["pads"], node.attrs["out_hw"],
                node.attrs.get("group", 1))
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return _activation(node, y)


#: Elementwise functions of one value (float32, ONNX's definitions), by float IR op; the
#: accelerator computes each as a 256-entry lookup table on the int8 value
#: (:func:`hwonnx.quant.tables.activation_table`). Derived from :data:`.tables.TABLE_OPS`, the
#: one list of the table operators; ``attrs`` holds each operator's attributes.
TABLE_FUNCTIONS: "dict[str, Callable[[np.ndarray, dict], np.ndarray]]" = {
    op: table.fn for op, table in TABLE_OPS.items()}


#: One function per float IR op: ``fn(graph, node, *inputs) -> output``.
FLOAT_OPS: "dict[str, Callable[..., np.ndarray]]" = {
    "Conv": _conv,
    "Dense": _dense,
    "ConvTranspose": _conv_transpose,
    "Add": lambda graph, node, a, b: _activation(node, a + b),
    "Eltwise": _eltwise,
    "AvgPool": _avgpool,
    "MaxPool": _maxpool,
    "Concat": _concat,
    "Slice": _slice,
    "Permute": lambda graph, node, x: _activation(node, np.transpose(x, node.attrs["perm"])),
    "ChannelPermute": lambda graph, node, x: _activation(
        node, x[:, list(node.attrs["channels"])]),
    "Relu": lambda graph, node, x: np.maximum(x, 0),
    "Clip": _clip,
    "BatchNorm": _batchnorm,
    "Flatten": _reshape,
    "Reshape": _reshape,
    "Identity": lambda graph, node, x: x,
    "Softmax": _softmax,
    **{op: (lambda fn: lambda graph, node, x: fn(np.asarray(x, np.float32), node.attrs))(fn)
       for op, fn in TABLE_FUNCTIONS.items()},
}


def first_not_finite(graph: Graph, values: "dict[str, np.ndarray]") -> "Node | None":
    """The first node of ``graph`` with a float output in ``values`` holding inf or NaN."""
    for node in graph.nodes:
        for name in node.outputs:
            value = values.get(name)
            if value is not None and value.dtype.kind == "f" and not np.isfinite(value).all():
                return node
    return None


def evaluate_float(graph: Graph, feeds: "dict[str, np.ndarray]",
                   keep_all: bool = False) -> "dict[str, np.ndarray]":
    """Evaluate a float graph in float32.

    Parameters
    ----------
    graph : Graph
        A graph of the float vocabulary.
    feeds : dict of str to numpy.ndarray
        A value for every graph input, of the input's type shape; the leading (batch)
        dimension may be larger than 1 to evaluate many samples at once.
    keep_all : bool
        Return every value (inputs, constants and node outputs), not only the graph outputs.

    Returns
    -------
    dict of str to numpy.ndarray
        Arrays of the values' IR types (float32; int64 indices of a host ``ArgMax`` or
        ``TopK``), by value name. Host steps (:mod:`hwonnx.golden.host`) run sample by
        sample. Where the float32 arithmetic overflows, a value holds inf or NaN, as in the
        float model, without a warning: the caller checks (:func:`first_not_finite`).

    Raises
    ------
    ValueError
        If a feed is missing, is complex or its shape does not fit the graph input.
    ResourceError
        If a node breaks a work bound (:func:`check_node_work`); the frontend refuses such
        models, so only a graph built otherwise can.
    NotImplementedError
        If the graph holds an op outside the float vocabulary (a bug: the frontend only
        produces these ops).
    """
    env: "dict[str, np.ndarray]" = {k: np.asarray(v, np.float32)
                                    for k, v in graph.constants.items()}
    for name in graph.inputs:
        if name not in feeds:
            raise ValueError(f"No value fed for graph input '{name}'")
        if np.iscomplexobj(feeds[name]):
            raise ValueError(f"Feed for graph input '{name}' is complex "
                             f"({np.asarray(feeds[name]).dtype}); hwonnx evaluates real "
                             f"numbers only")
        value = np.asarray(feeds[name], dtype=np.float32)
        expected = graph.types[name].shape
        if value.ndim != len(expected) or value.shape[1:] != expected[1:]:
            raise ValueError(f"Feed for graph input '{name}' must have shape "
                             f"{list(expected)} (any leading size), not {list(value.shape)}")
        env[name] = value
    for node in graph.nodes:
        args = [env[v] for v in node.inputs]
        fn = FLOAT_OPS.get(node.op)
        if fn is not None:
            check_node_work(node, graph.types)
        if fn is None and node.op not in HOST_FUNCTIONS:
            raise NotImplementedError(f"No float reference for IR op {node.op} "
                                      f"(node '{node.name}')")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if fn is None:                       # a host step, sample by sample
                env.update(zip(node.outputs, run_host(node, args, [
                    v not in graph.constants for v in node.inputs], graph.types)))
                continue
            out = graph.types.get(node.outputs[0])
            env[node.outputs[0]] = np.asarray(fn(graph, node, *args),
                                              dtype=out.dtype if out else np.float32)
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}
