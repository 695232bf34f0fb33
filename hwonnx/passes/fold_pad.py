"""``fold-pad``: fold a constant ``Pad`` of the spatial axes into the padding of the ``Conv``,
``AvgPool`` and ``MaxPool`` nodes reading it."""

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..golden.im2col import windows_touch_input
from ..ir.ops import IR_OPS
from ..ir.graph import Graph, Node
from .rewrite import Edit, GraphEditor, rewrite_each

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FoldPad"]


@dataclass(frozen=True)
class FoldPad:
    """Remove ``y = Pad(x) {pads, value}`` (the frontend's transient node for an ONNX ``Pad``
    with mode ``constant`` on the two spatial axes; ``pads`` is ``(top, left, bottom, right)``)
    when every reader of ``y`` is a ``Conv``, an ``AvgPool`` or a ``MaxPool`` reading it as its
    input: each reader reads ``x`` instead, with ``pads`` added to its own and, for a value
    other than its own padding's (0; -inf for ``MaxPool``), ``pad_value`` set. A reader with
    padding of its own qualifies only when the values agree. An ``AvgPool`` qualifies only with
    ``count_include_pad`` (the padded values count in the mean) or no padding of its own (it
    then gets ``count_include_pad = True``), and only while every pad stays smaller than its
    kernel.

    A ``Pad`` that is a graph output or has any other reader is left alone;
    :func:`hwonnx.frontend.load_model` then refuses it.
    """
    name: str = "fold-pad"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, _fold)


def _absorb(node: Node, value: str, pads: "tuple[int, ...]", fill: float,
            shape: "tuple[int, ...]") -> "Node | None":
    """Return ``node`` reading the unpadded input (of ``shape``) with ``pads`` of value ``fill``
    added, None if it cannot."""
    if not (node.op in IR_OPS and IR_OPS[node.op].windowed) or node.inputs[0] != value \
            or value in node.inputs[1:]:
        return None
    default = -math.inf if node.op == "MaxPool" else 0.0
    own = node.attrs.get("pad_value", default)
    if (any(node.attrs["pads"]) or "pad_value" in node.attrs) and fill != own:
        return None
    if not math.isfinite(fill) and node.op != "MaxPool":
        return None                   # an infinite sum: left for the support check to refuse
    total = tuple(a + b for a, b in zip(node.attrs["pads"], pads))
    extra = {} if fill == default else {"pad_value": fill}
    if node.op == "MaxPool" and fill == -math.inf and not all(
            windows_touch_input(size, k, s, begin, end, d) for size, k, s, begin, end, d in zip(
                shape[2:], node.attrs["kernel"], node.attrs["strides"], total[:2], total[2:],
                node.attrs["dilations"])):
        return None                   # a window entirely in -inf padding
    if node.op in ("Conv", "MaxPool"):
        return node.with_attrs(pads=total, **extra)
    if not node.attrs["count_include_pad"] and any(node.attrs["pads"]):
        return None
    if any(p >= k for p, k in zip(total, tuple(node.attrs["kernel"]) * 2)):
        return None
    return node.with_attrs(pads=total, count_include_pad=True, **extra)


def _fold(graph: GraphEditor, pad: Node) -> "Edit | None":
    if pad.op != "Pad":
        return None
    source, value = pad.inputs[0], pad.outputs[0]
    readers = graph.consumers(value)
    if value in graph.outputs or not readers:
        return None
    absorbed = []
    for reader in readers:
        new = _absorb(reader, value, tuple(pad.attrs["pads"]), pad.attrs.get("value", 0.0),
                      graph.types[source].shape)
        if new is None:
            return None
        absorbed.append((reader, replace(new, inputs=(source, *new.inputs[1:]))))
    return Edit(((pad, None), *absorbed))
