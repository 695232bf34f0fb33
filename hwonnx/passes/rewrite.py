"""Helpers shared by the passes; every one returns new objects and mutates nothing (but a
:class:`GraphEditor`, the working copy of a graph that :func:`rewrite_each` edits)."""

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import numpy as np

from ..errors import ModelError
from ..ir.graph import Graph, Node, TensorType
from ..ir.ops import LAYER, LAYOUT, ir_ops

__all__ = ["LAYER_OPS", "LAYOUT_OPS", "has_activation", "sole_consumer", "fresh_name", "prune",
           "Edit", "GraphEditor", "rewrite_each", "fuse_into_producer", "through_layout",
           "per_channel", "fold_channel_affine", "channel_scale_node", "channel_weight"]

#: Layer-like float ops: each carries ``relu`` (bool) and ``act_max`` (float or None), applied
#: in that order after the op itself.
LAYER_OPS = ir_ops(LAYER)

#: Float ops that only change the shape, not the order of the data: ``Reshape`` (the frontend
#: maps ``Squeeze``, ``Unsqueeze`` and a ``Transpose`` that moves only size-1 axes to it) and
#: ``Flatten``. The folds follow them (:func:`through_layout`).
LAYOUT_OPS = ir_ops(LAYOUT)


def has_activation(node: Node) -> bool:
    """Return whether ``node`` already has a fused ReLU or an upper clip bound."""
    return bool(node.attrs.get("relu")) or node.attrs.get("act_max") is not None


def sole_consumer(graph: "Graph | GraphEditor", value: str) -> "Node | None":
    """Return the only node reading ``value``, or None if ``value`` is a graph output or is
    read by several nodes (or none)."""
    if value in graph.outputs:
        return None
    consumers = graph.consumers(value)
    return consumers[0] if len(consumers) == 1 else None


def fresh_name(graph: "Graph | GraphEditor", base: str) -> str:
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


@dataclass(frozen=True)
class Edit:
    """A local rewrite of a graph, as :func:`rewrite_each` applies it.

    ``nodes`` pairs each node the rewrite changes with its replacement, which takes its place
    in the order (None deletes it); ``constants`` are added (typed by their arrays) and
    ``types`` set (a value the rewrite moves to another shape). Constants no node reads any
    more and the types of values no longer defined are dropped afterwards, as by
    :func:`prune`.
    """
    nodes: "tuple[tuple[Node, Node | None], ...]"
    constants: "Mapping[str, np.ndarray]" = field(default_factory=dict)
    types: "Mapping[str, TensorType]" = field(default_factory=dict)


class GraphEditor:
    """A graph being rewritten by :func:`rewrite_each`: what a rewrite reads of a
    :class:`~hwonnx.ir.graph.Graph` (``inputs``, ``outputs``, ``types``, ``constants``,
    ``meta``, :meth:`producer`, :meth:`consumers`), indexed so that a look-up, and applying an
    :class:`Edit`, take time in proportion to the nodes concerned rather than to the graph.
    ``types`` and ``constants`` are read-only views that follow the edits."""

    def __init__(self, graph: Graph):
        self.inputs, self.outputs, self.meta = graph.inputs, graph.outputs, graph.meta
        self._graph = graph
        self._types = dict(graph.types)
        self._constants = dict(graph.constants)
        self.types: "Mapping[str, TensorType]" = MappingProxyType(self._types)
        self.constants: "Mapping[str, np.ndarray]" = MappingProxyType(self._constants)
        self._input_set, self._output_set = set(graph.inputs), set(graph.outputs)
        self._nodes: "list[Node | None]" = list(graph.nodes)
        self._skip = list(range(1, len(self._nodes) + 1))    # a deleted place -> a later one
        self._position: "dict[int, int]" = {}                 # id(node) -> its place
        self._producer: "dict[str, Node]" = {}
        self._readers: "dict[str, dict[int, Node]]" = {}      # value -> {id(node): node}
        self.edits = 0
        for index, node in enumerate(self._nodes):
            self._index(node, index)

    def _index(self, node: Node, index: int) -> None:
        self._position[id(node)] = index
        for value in node.outputs:
            self._producer[value] = node
        for value in node.inputs:
            self._readers.setdefault(value, {})[id(node)] = node

    def _unindex(self, node: Node) -> int:
        index = self._position.pop(id(node))
        for value in node.outputs:
            if self._producer.get(value) is node:
                del self._producer[value]
        for value in node.inputs:
            readers = self._readers.get(value)
            if readers is not None:
                readers.pop(id(node), None)
                if not readers:
                    del self._readers[value]
        return index

    def producer(self, value: str) -> "Node | None":
        """Return the node writing ``value``, None for an input, a constant or no value."""
        return self._producer.get(value)

    def consumers(self, value: str) -> "list[Node]":
        """Return the nodes reading ``value``, in graph order."""
        readers = self._readers.get(value)
        if not readers:
            return []
        return sorted(readers.values(), key=lambda node: self._position[id(node)])

    def position(self, node: Node) -> int:
        """Return the place of ``node`` in the order (kept while other nodes go)."""
        return self._position[id(node)]

    def next_node(self, index: int) -> "tuple[int, Node] | None":
        """Return the first node at place ``index`` or later, with its place."""
        nodes, skip, end = self._nodes, self._skip, len(self._nodes)
        found = index
        while found < end and nodes[found] is None:
            found = skip[found]
        while index < found and nodes[index] is None:     # path compression
            following = skip[index]
            skip[index] = found
            index = following
        return (found, nodes[found]) if found < end else None

    def apply(self, edit: Edit) -> "tuple[list[int], list[Node]]":
        """Apply ``edit``. Return the places of the nodes it replaced or deleted, and the nodes
        it put in and the producers of the values the nodes it changed read or write."""
        places, values = [], set(edit.constants) | set(edit.types)
        for old, _ in edit.nodes:
            places.append(self._unindex(old))
            values.update(old.inputs)
            values.update(old.outputs)
        for (old, new), index in zip(edit.nodes, places):
            self._nodes[index] = new
            if new is None:
                self._skip[index] = index + 1
            else:
                self._index(new, index)
                values.update(new.inputs)
                values.update(new.outputs)
        self._types.update(edit.types)
        for name, value in edit.constants.items():
            self._constants[name] = value
            self._types[name] = TensorType(str(value.dtype), tuple(value.shape))
        self.edits += 1
        if self.edits == 1:
            self._prune(set(self._types) | set(self._constants))    # as prune() does
        else:
            self._prune(values)
        changed = [new for _, new in edit.nodes if new is not None]
        changed += [node for node in (self._producer.get(v) for v in values) if node is not None]
        return places, changed

    def _prune(self, values: "set[str]") -> None:
        for value in values:
            if value in self._constants and value not in self._readers \
                    and value not in self._output_set:
                del self._constants[value]
            if value in self._types and value not in self._input_set \
                    and value not in self._constants and value not in self._producer:
                del self._types[value]

    def graph(self) -> Graph:
        """Return the edited graph (the original object if no edit was applied)."""
        if not self.edits:
            return self._graph
        return replace(self._graph, nodes=tuple(n for n in self._nodes if n is not None),
                       types=self._types, constants=self._constants)


def rewrite_each(graph: Graph, rewrite: "Callable[[GraphEditor, Node], Edit | None]",
                 viewers: "Callable[[GraphEditor, Node], Iterable[Node]] | None" = None
                 ) -> Graph:
    """Apply ``rewrite`` to the first node it accepts (returns an :class:`Edit` for) until it
    accepts none; return the new graph, or ``graph`` itself if it accepted none.

    ``rewrite`` sees the graph through a :class:`GraphEditor`. After an edit, the search
    resumes at the first node whose rewrite may have changed its answer, so the result is the
    same as starting again from the first node, in time linear in the size of the graph for
    rewrites that look at a few nodes around the one they are given. Those are the nodes the
    edit replaced or deleted, the producers of the values they read and, for rewrites that look
    further down the graph than the readers of their node's outputs, the nodes ``viewers``
    returns for each of these (the nodes before it whose rewrite may look at it). Every
    accepted rewrite must remove a node, or change one so that it is not accepted again, which
    bounds the iterations.
    """
    editor = GraphEditor(graph)
    limit, index = len(graph.nodes) + 1, 0
    while (found := editor.next_node(index)) is not None:
        index, node = found
        edit = rewrite(editor, node)
        if edit is None:
            index += 1
            continue
        if editor.edits == limit:
            raise RuntimeError("rewrite_each: a rewrite did not remove a node")
        places, changed = editor.apply(edit)
        if viewers is not None:
            changed += [seen for node in changed for seen in viewers(editor, node)]
        index = min([*places, *(editor.position(n) for n in changed)])
    return editor.graph()


def fuse_into_producer(graph: "GraphEditor", producer: Node, consumer: Node, fused: Node,
                       constants: "dict[str, np.ndarray] | None" = None,
                       chain: "tuple[Node, ...]" = ()) -> Edit:
    """Replace ``producer`` by ``fused`` (at the producer's place), delete ``consumer`` and add
    ``constants``; ``fused`` writes the consumer's output so value names stay stable. With a
    ``chain`` of layout nodes between them (:func:`through_layout`), ``fused`` writes the
    producer's output and the last layout node writes the consumer's output instead."""
    if chain:
        fused = replace(fused, outputs=producer.outputs)
        last = replace(chain[-1], outputs=consumer.outputs)
        nodes = ((producer, fused), (chain[-1], last), (consumer, None))
    else:
        nodes = ((producer, replace(fused, outputs=consumer.outputs)), (consumer, None))
    return Edit(nodes, constants or {})


def through_layout(graph: "Graph | GraphEditor", value: str, reader: Node
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


def fold_channel_affine(graph: "GraphEditor", producer: Node, chain: "tuple[Node, ...]",
                        consumer: Node, scale: np.ndarray, bias, what: str,
                        attrs: "dict | None" = None) -> Edit:
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
