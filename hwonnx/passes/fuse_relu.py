"""``fuse-relu``: fold ``Relu`` into the preceding layer-like node (``Conv``, ``Dense``,
``Add``, ``AvgPool``, ``MaxPool``, ``Concat``)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir.graph import Graph, Node
from .rewrite import (LAYER_OPS, Edit, GraphEditor, fuse_into_producer, rewrite_each,
                      through_layout)

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FuseRelu"]


@dataclass(frozen=True)
class FuseRelu:
    """Replace ``Relu(y)``, where ``y`` is written by a ``Conv``, ``Dense``, ``Add``,
    ``AvgPool``, ``MaxPool`` or ``Concat`` without fused ReLU (and without a negative
    ``act_max``) that
    nothing else reads, by that node with ``relu=True`` writing the ``Relu`` output.

    Layout nodes (``Reshape``, ``Flatten``) may sit between them, each read only by the next
    and none quantized by a pre-quantized model (``PassContext.quantized``); they stay, the
    last writing the ``Relu`` output (an element-wise function commutes with them)."""
    name: str = "fuse-relu"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, lambda g, node: _fuse(g, node, ctx.quantized))


def _fuse(graph: GraphEditor, relu: Node, quantized: "frozenset[str]") -> "Edit | None":
    if relu.op != "Relu":
        return None
    producer, chain, values = through_layout(graph, relu.inputs[0], relu)
    if producer is None or producer.op not in LAYER_OPS or producer.attrs.get("relu") \
            or (chain and any(v in quantized for v in values)):
        return None
    act_max = producer.attrs.get("act_max")
    if act_max is not None and act_max < 0:   # max(min(y, a), 0) = 0 is not min(max(y, 0), a)
        return None
    return fuse_into_producer(graph, producer, relu, producer.with_attrs(relu=True),
                              chain=chain)
