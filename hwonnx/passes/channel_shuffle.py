"""``channel-shuffle``: a ``Permute`` between layout nodes that, as a whole, only permutes the
channels of a ``[1, C, H, W]`` image becomes one ``ChannelPermute`` (ShuffleNet's channel
shuffle, as torch.onnx writes it: ``Reshape`` to ``[1, g, C / g, H, W]``, ``Transpose`` with
perm ``[0, 2, 1, 3, 4]``, ``Reshape`` back to ``[1, C, H, W]``; any group count, any perm and
any layout nodes whose composition moves whole channels). The array runs it as a 1x1 copy
whose weights are a 0/1 permutation matrix, requantized by the identity, so the int8 values
are copied exactly (``QChannelPermute``).

:func:`channel_order` is the one rule: the frontend's ``Transpose`` converter asks it whether
a Transpose that is not a ``[1, C, H, W]`` permute is such a shuffle (and refuses it if not),
and this pass asks it again on the float graph."""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import LAYOUT_OPS, Edit, GraphEditor, rewrite_each, sole_consumer

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["ChannelShuffle", "channel_order"]

#: The most elements of an image whose shuffle :func:`channel_order` works out (it follows
#: every element's index; hwonnx's run-time values are smaller, ``MAX_VALUE_ELEMENTS``).
MAX_SHUFFLE_ELEMENTS = 1 << 26


def channel_order(source: "tuple[int, ...]", before: "tuple[int, ...]", perm,
                  after: "tuple[int, ...]") -> "tuple[int, ...] | None":
    """The channel permutation done by reshaping a ``source`` image ``[1, C, H, W]`` to
    ``before``, transposing it by ``perm`` and reshaping the result to ``after``: ``order``
    with output channel ``c`` equal to input channel ``order[c]``; None when ``after`` is not
    ``source``'s shape or the result is not a permutation of whole channels (each output
    channel one input channel's ``H x W`` pixels, in their order)."""
    source, before, after = tuple(source), tuple(before), tuple(after)
    perm = tuple(int(p) for p in perm)
    n = math.prod(source)
    if len(source) != 4 or source[0] != 1 or after != source or math.prod(before) != n \
            or sorted(perm) != list(range(len(before))) or not 0 < n <= MAX_SHUFFLE_ELEMENTS:
        return None
    channels = source[1]
    pixels = n // channels
    index = np.arange(n, dtype=np.int64).reshape(before).transpose(perm).reshape(channels,
                                                                                 pixels)
    first = index[:, 0]
    if (first % pixels).any() or not (index == first[:, None] + np.arange(pixels)).all():
        return None
    return tuple(int(c) for c in first // pixels)


@dataclass(frozen=True)
class ChannelShuffle:
    """Replace each ``Permute`` ``t`` that sits between layout nodes (``Reshape``/``Flatten``,
    each value between them read only by the next node and not a graph output) going from a
    ``[1, C, H, W]`` value (the first one up that another node reads too, or that a layer
    writes) to the next value of that same shape down, and whose composition is a
    channel permutation (:func:`channel_order`), by one ``ChannelPermute`` {``channels``,
    ``relu``, ``act_max``} named after ``t`` (by a ``Reshape`` to the same shape when the
    permutation is the identity). Any other ``Permute`` is left as it is (``check_fused``
    refuses one the array cannot copy)."""
    name: str = "channel-shuffle"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, _rewrite)


def _rewrite(graph: GraphEditor, t: Node) -> "Edit | None":
    if t.op != "Permute":
        return None
    before, source, reader = [], t.inputs[0], t
    while True:                      # up through layout nodes whose values only they read
        producer = graph.producer(source)
        if producer is None or producer.op not in LAYOUT_OPS \
                or sole_consumer(graph, source) is not reader:
            break
        before.insert(0, producer)
        source, reader = producer.inputs[0], producer
    shape = graph.types[source].shape
    after, value = [], t.outputs[0]
    while graph.types[value].shape != shape or not (before or after):
        reader = sole_consumer(graph, value)
        if reader is None or reader.op not in LAYOUT_OPS or reader.inputs[0] != value:
            return None
        after.append(reader)
        value = reader.outputs[0]
    order = channel_order(shape, graph.types[t.inputs[0]].shape, t.attrs["perm"], shape)
    if order is None:
        return None
    if order == tuple(range(len(order))):
        new = Node(t.name, "Reshape", (source,), (value,), {"shape": tuple(shape)})
    else:
        new = Node(t.name, "ChannelPermute", (source,), (value,),
                   {"channels": order, "relu": bool(t.attrs.get("relu")),
                    "act_max": t.attrs.get("act_max")})
    return Edit(((t, new), *((node, None) for node in (*before, *after))))
