"""Helpers shared by the passes; every one returns new objects and mutates nothing."""

from dataclasses import replace
from typing import Callable

import numpy as np

from ..ir.graph import Graph, Node, TensorType

__all__ = ["LAYER_OPS", "has_activation", "sole_consumer", "fresh_name", "prune", "rewrite_each",
           "fuse_into_producer", "channel_scale_node", "channel_weight"]

#: Layer-like float ops: each carries ``relu`` (bool) and ``act_max`` (float or None), applied
#: in that order after the op itself.
LAYER_OPS = frozenset({"Conv", "Dense", "Add", "AvgPool", "MaxPool", "Concat"})


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
                       constants: "dict[str, np.ndarray] | None" = None) -> Graph:
    """Replace ``producer`` by ``fused`` (at the producer's place), delete ``consumer`` and add
    ``constants``; ``fused`` writes the consumer's output so value names stay stable."""
    nodes = tuple(fused if node is producer else node
                  for node in graph.nodes if node is not consumer)
    constants = constants or {}
    types = dict(graph.types)
    for name, value in constants.items():
        types[name] = TensorType(str(value.dtype), tuple(value.shape))
    return prune(replace(graph, nodes=nodes, types=types,
                         constants={**graph.constants, **constants}))


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
