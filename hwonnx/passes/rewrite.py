"""Helpers shared by the passes; every one returns new objects and mutates nothing."""

from dataclasses import replace
from typing import Callable

import numpy as np

from ..errors import ModelError
from ..ir.graph import Graph, Node, TensorType

__all__ = ["LAYER_OPS", "LAYOUT_OPS", "has_activation", "sole_consumer", "fresh_name", "prune",
           "rewrite_each", "fuse_into_producer", "through_layout", "per_channel",
           "fold_channel_affine", "channel_scale_node", "channel_weight"]

#: Layer-like float ops: each carries ``relu`` (bool) and ``act_max`` (float or None), applied
#: in that order after the op itself.
LAYER_OPS = frozenset({"Conv", "Dense", "Add", "AvgPool", "MaxPool", "Concat", "Eltwise"})

#: Float ops that only change the shape, not the order of the data: ``Reshape`` (the frontend
#: maps ``Squeeze``, ``Unsqueeze`` and a ``Transpose`` that moves only size-1 axes to it) and
#: ``Flatten``. The folds follow them (:func:`through_layout`).
LAYOUT_OPS = frozenset({"Reshape", "Flatten"})


def has_activation(node: Node) -> bool:
    """Return whether ``node`` already has a fused ReLU or an upper clip bound."""
    return bool(node.attrs.get("relu")) or node.attrs.get("act_max") is not None


def sole_consumer(graph: Graph, value: str) -> "Node | None":
    """Return the only node reading ``value``, or None if ``value`` is a graph output or is
    read by several nodes (or none)."""
    if value in graph.outputs:
        return None
    consumers = graph.consumers(value)
    return consumers[0] if len(consumers) == 1 else None


def fresh_name(graph: Graph, base: str) -> str:
    """Return ``base``, or ``base_<n>`` when ``base`` already names a value of ``graph``."""
    name, index = base, 1
    while name in graph.types or name in graph.constants:
        name, index = f"{base}_{index}", index + 1
    return name


def prune(graph: Graph) -> Graph:
    """Drop constants no node or output reads, and types of values no longer defined."""
    read = {v for node in graph.nodes for v in node.inputs} | set(graph.outputs)
    constants = {k: v for k, v in graph.constants.items() if k in read}
    defined = set(graph.inputs) | set(constants) | \
        {v for node in graph.nodes for v in node.outputs}
    types = {k: v for k, v in graph.types.items() if k in defined}
    return replace(graph, types=types, constants=constants)


def rewrite_each(graph: Graph, rewrite: "Callable[[Graph, Node], Graph | None]") -> Graph:
    """Apply ``rewrite`` to the first node it accepts (returns a graph for) until it accepts
    none. Every accepted rewrite must remove a node, which bounds the iterations."""
    for _ in range(len(graph.nodes) + 1):
        for node in graph.nodes:
            new = rewrite(graph, node)
            if new is not None:
                graph = new
                break
        else:
            return graph
    raise RuntimeError("rewrite_each: a rewrite did not remove a node")


def fuse_into_producer(graph: Graph, producer: Node, consumer: Node, fused: Node,
                       constants: "dict[str, np.ndarray] | None" = None,
                       chain: "tuple[Node, ...]" = ()) -> Graph:
    """Replace ``producer`` by ``fused`` (at the producer's place), delete ``consumer`` and add
    ``constants``; ``fused`` writes the consumer's output so value names stay stable. With a
    ``chain`` of layout nodes between them (:func:`through_layout`), ``fused`` writes the
    producer's output and the last layout node writes the consumer's output instead."""
    if chain:
        fused = replace(fused, outputs=producer.outputs)
        last = replace(chain[-1], outputs=consumer.outputs)
    else:
        fused, last = replace(fused, outputs=consumer.outputs), None
    nodes = tuple(fused if node is producer else last if chain and node is chain[-1] else node
                  for node in graph.nodes if node is not consumer)
    constants = constants or {}
    types = dict(graph.types)
    for name, value in constants.items():
        types[name] = TensorType(str(value.dtype), tuple(value.shape))
    return prune(replace(graph, nodes=nodes, types=types,
                         constants={**graph.constants, **constants}))


def through_layout(graph: Graph, value: str, reader: Node
                   ) -> "tuple[Node | None, tuple[Node, ...], tuple[str, ...]]":
    """Follow ``value`` (read by ``reader``) up through :data:`LAYOUT_OPS` nodes.

    Returns ``(producer, chain, values)``: the first node that is not a layout op, the layout
    nodes from it to ``value`` in data order (empty when ``producer`` writes ``value``), and
    the values from the producer's output to ``value``. Each of these values must be read only
    by the next node (and not be a graph output); if one is not, or ``value`` comes from a
    graph input or constant, ``producer`` is None.
    """
    chain, values = [], [value]
    while True:
        if sole_consumer(graph, value) is not reader:
            return None, (), ()
        node = graph.producer(value)
        if node is None or node.op not in LAYOUT_OPS:
            return node, tuple(reversed(chain)), tuple(reversed(values))
        chain.append(node)
        reader, value = node, node.inputs[0]
        values.append(value)


def per_channel(values: np.ndarray, shape: "tuple[int, ...]", target: "tuple[int, ...]"
                ) -> "np.ndarray | None":
    """Return the vector ``v`` with ``v[m]`` the value of ``values`` (broadcast to ``shape``)
    at every element of channel ``m`` (axis 1) of ``target``, a shape with the same number of
    elements and the same data order (a reshape of ``shape``); None if ``values`` does not
    broadcast to ``shape`` or varies within a channel of ``target`` (the layout moved an axis
    that the channels depend on)."""
    values = np.asarray(values, np.float64)
    try:
        full = np.broadcast_to(values, tuple(shape))
    except ValueError:
        return None
    padded = values.reshape((1,) * (len(shape) - values.ndim) + values.shape)
    if tuple(shape) == tuple(target) and all(d == 1 for i, d in enumerate(padded.shape)
                                             if i != 1):       # no layout: not materialized
        return np.broadcast_to(padded.reshape(-1), (target[1],)).copy()
    by_channel = np.moveaxis(full.reshape(tuple(target)), 1, 0).reshape(target[1], -1)
    if not (by_channel == by_channel[:, :1]).all():
        return None
    return by_channel[:, 0].copy()


def fold_channel_affine(graph: Graph, producer: Node, chain: "tuple[Node, ...]",
                        consumer: Node, scale: np.ndarray, bias, what: str,
                        attrs: "dict | None" = None) -> Graph:
    """Fold ``y = x * scale[m] + ...`` on output channel ``m`` of the ``Conv``/``Dense``
    ``producer`` (constant weight and bias, no activation) into it: output channel ``m`` of
    the weight is scaled by ``scale[m]`` and the bias becomes ``bias(old_bias)`` (a function of
    the old bias, zeros if absent; float64, stored as float32). ``consumer`` (read through the
    layout ``chain``) is deleted; the layer takes ``attrs`` (an activation). ``what`` names
    the folded node in the error.

    Raises
    ------
    ModelError
        If the folded weights or bias exceed float32.
    """
    weight = graph.constants[producer.inputs[1]].astype(np.float64)
    channels = len(scale)
    weight = weight * (scale[:, None, None, None] if producer.op == "Conv" else scale[None, :])
    old_bias = graph.constants[producer.inputs[2]].astype(np.float64) \
        if len(producer.inputs) > 2 else np.zeros(channels)
    new_bias = bias(old_bias)
    limit = np.finfo(np.float32).max
    if not (np.abs(weight) <= limit).all() or not (np.abs(new_bias) <= limit).all():
        raise ModelError(f"{what} folded into {producer.op} '{producer.name}' gives weights or "
                         f"a bias beyond float32")
    suffix = {"BatchNorm": "bn"}.get(consumer.op, consumer.op.lower())
    w_name = fresh_name(graph, f"{producer.name}_weight_{suffix}")
    b_name = fresh_name(graph, f"{producer.name}_bias_{suffix}")
    fused = replace(producer.with_attrs(**(attrs or {})) if attrs else producer,
                    inputs=(producer.inputs[0], w_name, b_name))
    return fuse_into_producer(graph, producer, consumer, fused, {
        w_name: weight.astype(np.float32),
        b_name: new_bias.astype(np.float32),
    }, chain)


def channel_scale_node(name: str, op_inputs: "tuple[str, ...]", output: str,
                       shape: "tuple[int, ...]") -> "Node | None":
    """Return the ``Conv`` (4-D ``shape``: depthwise 1x1, ``group = C``) or ``Dense`` (``[1, K]``
    ``shape``: diagonal weight) that scales channel ``c`` of its input by ``w[c]`` (plus
    ``bias[c]`` when a bias is given); ``op_inputs`` are the input, weight (and bias) names.
    None for any other shape. Used by the ``batchnorm-to-conv`` pass and the
    frontend's ``Mul`` converter."""
    if len(shape) == 4:
        return Node(name, "Conv", op_inputs, (output,),
                    {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1),
                     "group": int(shape[1]), "relu": False, "act_max": None})
    if len(shape) == 2 and shape[0] == 1:
        return Node(name, "Dense", op_inputs, (output,), {"relu": False, "act_max": None})
    return None


def channel_weight(shape: "tuple[int, ...]", scale: np.ndarray) -> np.ndarray:
    """Return the weight of :func:`channel_scale_node` for the per-channel ``scale``
    (``[C, 1, 1, 1]``, or the ``[K, K]`` diagonal matrix for a 2-D ``shape``)."""
    scale = np.asarray(scale, np.float32)
    return scale.reshape(-1, 1, 1, 1) if len(shape) == 4 else np.diag(scale)
