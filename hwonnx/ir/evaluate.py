"""NumPy float32 reference evaluator of the float IR vocabulary (``Conv``, ``Dense``, ``Add``,
``AvgPool``, ``MaxPool``, ``Concat``, ``Relu``, ``Clip``, ``BatchNorm``, ``Flatten``, ``Reshape``,
``Identity``, ``Softmax``, and the elementwise ``LeakyRelu``, ``Sigmoid``, ``Tanh``,
``HardSigmoid``, ``HardSwish``).

The layer-like ops ``Conv``, ``Dense``, ``Add``, ``AvgPool``, ``MaxPool`` and ``Concat``
(channel axis) apply their fused activation after the op: ``max(y, 0)`` if ``relu``, then
``min(y, act_max)`` if ``act_max`` is set."""

from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..golden.host import HOST_FUNCTIONS, run_host
from ..golden.im2col import conv_output_size, im2col
from .graph import Graph, Node

__all__ = ["FLOAT_OPS", "TABLE_FUNCTIONS", "evaluate_float"]


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


def _conv(graph: Graph, node: Node, x, w, b=None):
    m, cg, kh, kw = w.shape
    group = node.attrs.get("group", 1)
    cols = im2col(x, (kh, kw), node.attrs["strides"], node.attrs["pads"],
                  node.attrs["dilations"], pad_value=node.attrs.get("pad_value", 0.0))
    (sy, sx), (dy, dx) = node.attrs["strides"], node.attrs["dilations"]
    top, left, bottom, right = node.attrs["pads"]
    out_h = conv_output_size(x.shape[2], kh, sy, top, bottom, dy)
    out_w = conv_output_size(x.shape[3], kw, sx, left, right, dx)
    n, length = cols.shape[:2]
    # The patch axis is ordered (c, ky, kx), so group g owns a contiguous slice of it.
    cols = cols.reshape(n, length, group, cg * kh * kw).transpose(2, 0, 1, 3)  # [G, N, L, K]
    wg = w.reshape(group, 1, m // group, cg * kh * kw).transpose(0, 1, 3, 2)   # [G, 1, K, J]
    y = (cols @ wg).transpose(1, 0, 3, 2)                                      # [N, G, J, L]
    y = y.reshape(n, m, out_h, out_w)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return _activation(node, y)


def _dense(graph: Graph, node: Node, x, w, b=None):
    y = x @ w
    if b is not None:
        y = y + b
    return _activation(node, y)


def _avgpool(graph: Graph, node: Node, x):
    (kh, kw), (sy, sx) = node.attrs["kernel"], node.attrs["strides"]
    top, left, bottom, right = node.attrs["pads"]
    n, c, h, w = x.shape
    padded = np.full((n, c, h + top + bottom, w + left + right),
                     node.attrs.get("pad_value", 0.0), np.float32)
    padded[:, :, top:top + h, left:left + w] = x
    out_h = conv_output_size(h, kh, sy, top, bottom, 1)
    out_w = conv_output_size(w, kw, sx, left, right, 1)
    windows = sliding_window_view(padded, (kh, kw), axis=(2, 3))
    total = windows[:, :, :sy * (out_h - 1) + 1:sy, :sx * (out_w - 1) + 1:sx].sum(
        axis=(-2, -1), dtype=np.float32)
    if node.attrs["count_include_pad"]:
        count = np.float32(kh * kw)
    else:                                     # the real (unpadded) pixels under each window
        inside = np.zeros(padded.shape[2:], np.float32)
        inside[top:top + h, left:left + w] = 1
        count = sliding_window_view(inside, (kh, kw))[
            :sy * (out_h - 1) + 1:sy, :sx * (out_w - 1) + 1:sx].sum(axis=(-2, -1))
    return _activation(node, total / count)


def _maxpool(graph: Graph, node: Node, x):
    kernel, strides = node.attrs["kernel"], node.attrs["strides"]
    pads, dilations = node.attrs["pads"], node.attrs["dilations"]
    n, c = x.shape[:2]
    patches = im2col(x, kernel, strides, pads, dilations,
                     pad_value=node.attrs.get("pad_value", -np.inf))
    out_h = conv_output_size(x.shape[2], kernel[0], strides[0], pads[0], pads[2], dilations[0])
    out_w = conv_output_size(x.shape[3], kernel[1], strides[1], pads[1], pads[3], dilations[1])
    y = patches.reshape(n, out_h * out_w, c, -1).max(axis=-1)
    return _activation(node, y.transpose(0, 2, 1).reshape(n, c, out_h, out_w))


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


def _sigmoid(x):
    e = np.exp(-np.abs(x))                    # no overflow for large |x|
    return np.where(x >= 0, np.float32(1) / (np.float32(1) + e), e / (np.float32(1) + e))


def _hard_sigmoid(x, alpha, beta):
    return np.clip(np.float32(alpha) * x + np.float32(beta), 0, 1)


#: Elementwise functions of one value (float32, ONNX's definitions), by float IR op; the
#: accelerator computes each as a 256-entry lookup table on the int8 value
#: (:func:`hwonnx.quant.ptq.activation_table`). ``attrs`` holds ``alpha``/``beta``.
TABLE_FUNCTIONS: "dict[str, Callable[[np.ndarray, dict], np.ndarray]]" = {
    "LeakyRelu": lambda x, attrs: np.where(x >= 0, x, x * np.float32(attrs["alpha"])),
    "Sigmoid": lambda x, attrs: _sigmoid(x),
    "Tanh": lambda x, attrs: np.tanh(x),
    "HardSigmoid": lambda x, attrs: _hard_sigmoid(x, attrs["alpha"], attrs["beta"]),
    "HardSwish": lambda x, attrs: x * _hard_sigmoid(x, 1 / 6, 0.5),
}


#: One function per float IR op: ``fn(graph, node, *inputs) -> output``.
FLOAT_OPS: "dict[str, Callable[..., np.ndarray]]" = {
    "Conv": _conv,
    "Dense": _dense,
    "Add": lambda graph, node, a, b: _activation(node, a + b),
    "AvgPool": _avgpool,
    "MaxPool": _maxpool,
    "Concat": lambda graph, node, *xs: _activation(node, np.concatenate(xs, axis=1)),
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
        sample.

    Raises
    ------
    ValueError
        If a feed is missing or its shape does not fit the graph input.
    NotImplementedError
        If the graph holds an op outside the float vocabulary (a bug: the frontend only
        produces these ops).
    """
    env: "dict[str, np.ndarray]" = {k: np.asarray(v, np.float32)
                                    for k, v in graph.constants.items()}
    for name in graph.inputs:
        if name not in feeds:
            raise ValueError(f"No value fed for graph input '{name}'")
        value = np.asarray(feeds[name], dtype=np.float32)
        expected = graph.types[name].shape
        if value.ndim != len(expected) or value.shape[1:] != expected[1:]:
            raise ValueError(f"Feed for graph input '{name}' must have shape "
                             f"{list(expected)} (any leading size), not {list(value.shape)}")
        env[name] = value
    for node in graph.nodes:
        args = [env[v] for v in node.inputs]
        fn = FLOAT_OPS.get(node.op)
        if fn is None and node.op in HOST_FUNCTIONS:     # a host step, sample by sample
            env.update(zip(node.outputs, run_host(node, args, [v not in graph.constants
                                                               for v in node.inputs],
                                                  graph.types)))
            continue
        if fn is None:
            raise NotImplementedError(f"No float reference for IR op {node.op} "
                                      f"(node '{node.name}')")
        out = graph.types.get(node.outputs[0])
        env[node.outputs[0]] = np.asarray(fn(graph, node, *args),
                                          dtype=out.dtype if out else np.float32)
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}
