"""``fuse-clip``: fold ``Clip`` into the preceding layer-like node (``Conv``, ``Dense``,
``Add``, ``AvgPool``, ``MaxPool``, ``Concat``) as ``relu`` and ``act_max``."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir.graph import Graph, Node
from .rewrite import (LAYER_OPS, Edit, GraphEditor, fuse_into_producer, rewrite_each,
                      through_layout)

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FuseClip"]


@dataclass(frozen=True)
class FuseClip:
    """Replace ``Clip(y)`` {``min``, ``max``}, where ``y`` is written by a ``Conv``,
    ``Dense``, ``Add``, ``AvgPool``, ``MaxPool`` or ``Concat`` that nothing else reads, by
    that node writing the ``Clip`` output, with ``relu=True`` if ``min`` is 0 and ``act_max``
    lowered to ``max`` (``min(act_max, max)``) if ``max`` is set; ``Relu6`` exports as
    ``Clip(0, 6)``.

    Layout nodes (``Reshape``, ``Flatten``) may sit between them, as for ``fuse-relu``.

    A ``Clip`` with any other ``min`` (not 0, not None), or after any other node, is left
    alone; :func:`hwonnx.frontend.load_model` then refuses it.
    """
    name: str = "fuse-clip"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, lambda g, node: _fuse(g, node, ctx.quantized))


def _fuse(graph: GraphEditor, clip: Node, quantized: "frozenset[str]") -> "Edit | None":
    if clip.op != "Clip":
        return None
    low, high = clip.attrs["min"], clip.attrs["max"]
    producer, chain, values = through_layout(graph, clip.inputs[0], clip)
    if low not in (None, 0) or producer is None or producer.op not in LAYER_OPS \
            or (chain and any(v in quantized for v in values)):
        return None
    attrs = {}
    if low == 0:
        attrs["relu"] = True
    if high is not None:
        old = producer.attrs.get("act_max")
        attrs["act_max"] = float(high) if old is None else min(float(old), float(high))
    return fuse_into_producer(graph, producer, clip, producer.with_attrs(**attrs), chain=chain)
