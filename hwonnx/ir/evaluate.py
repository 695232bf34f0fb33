"""NumPy float32 reference evaluator of the float IR vocabulary (``Conv``, ``Dense``, ``Relu``,
``Add``, ``BatchNorm``, ``Flatten``, ``Reshape``, ``Identity``)."""

from typing import Callable

import numpy as np

from ..golden.im2col import conv_output_size, im2col
from .graph import Graph, Node

__all__ = ["FLOAT_OPS", "evaluate_float"]


def _batch(shape: "tuple[int, ...]", n: int) -> "tuple[int, ...]":
    """Return the target ``shape`` for a batch of ``n`` samples (leading 1 replaced by ``n``)."""
    if n == 1:
        return shape
    if not shape or shape[0] != 1:
        raise ValueError(f"Cannot evaluate a batch of {n} through a reshape to {list(shape)}, "
                         f"whose leading dimension is not 1")
    return (n, *shape[1:])


def _conv(graph: Graph, node: Node, x, w, b=None):
    m, _, kh, kw = w.shape
    cols = im2col(x, (kh, kw), node.attrs["strides"], node.attrs["pads"],
                  node.attrs["dilations"])
    (sy, sx), (dy, dx) = node.attrs["strides"], node.attrs["dilations"]
    top, left, bottom, right = node.attrs["pads"]
    out_h = conv_output_size(x.shape[2], kh, sy, top, bottom, dy)
    out_w = conv_output_size(x.shape[3], kw, sx, left, right, dx)
    y = (cols @ w.reshape(m, -1).T).transpose(0, 2, 1).reshape(x.shape[0], m, out_h, out_w)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return np.maximum(y, 0) if node.attrs.get("relu") else y


def _dense(graph: Graph, node: Node, x, w, b=None):
    y = x @ w
    if b is not None:
        y = y + b
    return np.maximum(y, 0) if node.attrs.get("relu") else y


def _batchnorm(graph: Graph, node: Node, x, scale, bias, mean, var):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    s = scale / np.sqrt(var + np.float32(node.attrs["epsilon"]))
    return (x - mean.reshape(shape)) * s.reshape(shape) + bias.reshape(shape)


def _reshape(graph: Graph, node: Node, x):
    return x.reshape(_batch(graph.types[node.outputs[0]].shape, x.shape[0]))


#: One function per float IR op: ``fn(graph, node, *inputs) -> output``.
FLOAT_OPS: "dict[str, Callable[..., np.ndarray]]" = {
    "Conv": _conv,
    "Dense": _dense,
    "Relu": lambda graph, node, x: np.maximum(x, 0),
    "Add": lambda graph, node, a, b: a + b,
    "BatchNorm": _batchnorm,
    "Flatten": _reshape,
    "Reshape": _reshape,
    "Identity": lambda graph, node, x: x,
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
        float32 arrays, by value name.

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
        fn = FLOAT_OPS.get(node.op)
        if fn is None:
            raise NotImplementedError(f"No float reference for IR op {node.op} "
                                      f"(node '{node.name}')")
        args = [env[v] for v in node.inputs]
        env[node.outputs[0]] = np.asarray(fn(graph, node, *args), dtype=np.float32)
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}
