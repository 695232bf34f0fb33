"""``fuse-bias``: move a per-channel constant ``Add`` into the bias of a ``Conv``/``Dense``."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import (Edit, GraphEditor, fresh_name, fuse_into_producer, has_activation,
                      per_channel, rewrite_each, through_layout)

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FuseBias"]


@dataclass(frozen=True)
class FuseBias:
    """Fuse ``Add(y, c)`` into the ``Conv``/``Dense`` writing ``y`` (without fused ReLU or
    ``act_max``, and read by nothing else) when the constant ``c`` holds one value per output
    channel: shape
    ``[N]`` or ``[1, N]`` after ``Dense``, ``[N, 1, 1]`` or ``[1, N, 1, 1]`` after ``Conv``.
    The bias input is created if absent; the fused node takes the ``relu`` and ``act_max``
    of the ``Add``.

    Layout nodes (``Reshape``, ``Flatten``) may sit between the layer and the ``Add``, each
    read only by the next and none quantized by a pre-quantized model
    (``PassContext.quantized``), when ``c`` broadcasts to the ``Add``'s input without growing
    it and is constant on every channel of the layer's output (any such ``c``, a scalar
    too); the layout nodes stay, the last writing the ``Add``'s output.
    """
    name: str = "fuse-bias"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, lambda g, node: _fuse(g, node, ctx.quantized))


def _fuse(graph: GraphEditor, add: Node, quantized: "frozenset[str]") -> "Edit | None":
    if add.op != "Add":
        return None
    for value, other in (add.inputs, add.inputs[::-1]):
        if other not in graph.constants:
            continue
        producer, chain, values = through_layout(graph, value, add)
        if producer is None or producer.op not in ("Conv", "Dense") or has_activation(producer) \
                or (chain and any(v in quantized for v in values)) \
                or not all(v in graph.constants for v in producer.inputs[1:]):
            continue
        weight = graph.constants[producer.inputs[1]]
        n = weight.shape[0] if producer.op == "Conv" else weight.shape[1]
        addend = graph.constants[other]
        if chain:
            shape = tuple(graph.types[value].shape)
            per = per_channel(addend, shape, tuple(graph.types[producer.outputs[0]].shape)) \
                if tuple(graph.types[add.outputs[0]].shape) == shape else None
            if per is None:
                continue
        else:
            shapes = ((n, 1, 1), (1, n, 1, 1)) if producer.op == "Conv" else ((n,), (1, n))
            if addend.shape not in shapes:
                continue
            per = addend.reshape(n).astype(np.float64)
        old_bias = graph.constants[producer.inputs[2]] if len(producer.inputs) > 2 \
            else np.zeros(n, np.float32)
        b_name = fresh_name(graph, f"{producer.name}_bias_add")
        fused = replace(producer.with_attrs(relu=bool(add.attrs.get("relu")),
                                            act_max=add.attrs.get("act_max")),
                        inputs=(*producer.inputs[:2], b_name))
        return fuse_into_producer(graph, producer, add, fused, {
            b_name: (old_bias.astype(np.float64) + per).astype(np.float32)}, chain)
    return None
