"""``fuse-bias``: move a per-channel constant ``Add`` into the bias of a ``Conv``/``Dense``."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import fresh_name, fuse_into_producer, has_activation, rewrite_each, sole_consumer

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
    """
    name: str = "fuse-bias"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, _fuse)


def _fuse(graph: Graph, add: Node) -> "Graph | None":
    if add.op != "Add":
        return None
    for value, other in (add.inputs, add.inputs[::-1]):
        producer = graph.producer(value)
        if other not in graph.constants or producer is None \
                or producer.op not in ("Conv", "Dense") or has_activation(producer) \
                or sole_consumer(graph, value) is not add \
                or not all(v in graph.constants for v in producer.inputs[1:]):
            continue
        weight = graph.constants[producer.inputs[1]]
        n = weight.shape[0] if producer.op == "Conv" else weight.shape[1]
        shapes = ((n, 1, 1), (1, n, 1, 1)) if producer.op == "Conv" else ((n,), (1, n))
        addend = graph.constants[other]
        if addend.shape not in shapes:
            continue
        old_bias = graph.constants[producer.inputs[2]] if len(producer.inputs) > 2 \
            else np.zeros(n, np.float32)
        b_name = fresh_name(graph, f"{producer.name}_bias_add")
        fused = replace(producer.with_attrs(relu=bool(add.attrs.get("relu")),
                                            act_max=add.attrs.get("act_max")),
                        inputs=(*producer.inputs[:2], b_name), outputs=add.outputs)
        return fuse_into_producer(graph, producer, add, fused, {
            b_name: (old_bias.astype(np.float64) + addend.reshape(n)).astype(np.float32)})
    return None
