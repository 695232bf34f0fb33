"""``fold-transpose``: remove the data-moving ``Transpose`` nodes of the accelerator's part of
the graph that need no data movement: pairs that cancel, and a Keras-style NCHW -> NHWC
``Transpose`` before the ``Flatten``/``Reshape`` of a ``Dense``, folded into the order of the
``Dense``'s weight rows."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node, TensorType
from ..ir.ops import IR_OPS, TABLE
from .rewrite import LAYOUT_OPS, Edit, GraphEditor, fresh_name, rewrite_each, sole_consumer

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FoldTranspose", "ELEMENTWISE_UNARY"]

#: Float ops applied to each element on its own (so they commute with any ``Transpose``).
ELEMENTWISE_UNARY = frozenset({"Relu", "Clip", "Identity"}) | frozenset(
    op for op, entry in IR_OPS.items() if entry.kind == TABLE)


@dataclass(frozen=True)
class FoldTranspose:
    """For each ``Permute`` ``t`` (perm ``p``; a host step's ``Transpose`` is left), followed
    through nodes
    of :data:`ELEMENTWISE_UNARY` (each the only reader of the value before it, none a graph
    output):

    * to another ``Permute`` ``t2`` (perm ``q``): both are replaced by one ``Permute`` of
      perm ``p[q]`` after the element-wise nodes, or by none when that is the identity (the
      element-wise nodes then read ``t``'s input and their values take its axis order);
    * to layout nodes (``Flatten``/``Reshape``) that make a ``[1, K]`` vector read only by a
      ``Dense`` with a constant weight, keeping the batch axis in place (``p[0] = 0``): ``t``
      is removed, the layout nodes become one ``Reshape`` of the untransposed value, and row
      ``j`` of the weight moves to the flat position, in the untransposed value, of element
      ``j`` of the transposed one. The float results are unchanged (the same products, summed
      in another order). The ``Dense`` records the model's weight (``source_weight``) and
      where its rows went (``row_order``: row ``j`` is now row ``row_order[j]``), so that a
      pre-quantized model's integers follow them.

    Any other ``Permute`` is a data movement on the array (``QPermute``).
    """
    name: str = "fold-transpose"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, _fold, _viewers)


def _viewers(graph: GraphEditor, node: Node) -> "list[Node]":
    """The ``Permute`` nodes whose fold may look at ``node``: it follows the values after
    them down through element-wise and layout nodes (:func:`_follow`)."""
    found, stack, seen = [], [node], set()
    while stack:
        for value in stack.pop().inputs:
            producer = graph.producer(value)
            if producer is None or id(producer) in seen:
                continue
            seen.add(id(producer))
            if producer.op == "Permute":
                found.append(producer)
            elif producer.op in ELEMENTWISE_UNARY or producer.op in LAYOUT_OPS:
                stack.append(producer)
    return found


def _follow(graph: GraphEditor, start: str, ops) -> "tuple[list[Node], Node | None]":
    """The nodes of ``ops`` from the reader of ``start`` on, each the sole reader of the value
    before it, and the first sole reader that is not one of them (None if a value has several
    readers or is a graph output)."""
    chain, value = [], start
    while True:
        reader = sole_consumer(graph, value)
        if reader is None or reader.inputs[0] != value or reader.op not in ops:
            return chain, reader
        chain.append(reader)
        value = reader.outputs[0]


def _fold(graph: GraphEditor, t: Node) -> "Edit | None":
    if t.op != "Permute":
        return None
    perm = tuple(t.attrs["perm"])
    unary, after = _follow(graph, t.outputs[0], ELEMENTWISE_UNARY)
    if after is None:
        return None
    if after.op == "Permute":
        return _cancel(graph, t, unary, after, perm)
    layout, dense = _follow(graph, (unary[-1] if unary else t).outputs[0], LAYOUT_OPS)
    if after.op in LAYOUT_OPS and layout and dense is not None and dense.op == "Dense" \
            and perm[0] == 0 and not unary and dense.inputs[1] in graph.constants \
            and len(graph.types[dense.inputs[0]].shape) == 2:
        return _into_dense(graph, t, layout, dense, perm)
    return None


def _cancel(graph: GraphEditor, t: Node, unary: "list[Node]", t2: Node, perm) -> Edit:
    q = tuple(t2.attrs["perm"])
    composed = tuple(perm[axis] for axis in q)
    source_shape = graph.types[t.inputs[0]].shape
    types = {}
    renamed, value = [], t.inputs[0]
    for node in unary:                       # now on the untransposed axis order
        renamed.append(replace(node, inputs=(value,) + node.inputs[1:]))
        value = node.outputs[0]
        types[value] = TensorType(graph.types[value].dtype, source_shape)
    last = unary[-1] if unary else None
    if composed == tuple(range(len(composed))):
        if last is None:                     # t2 reads t: an Identity, removed by the next pass
            replacement = Node(t2.name, "Identity", (t.inputs[0],), t2.outputs)
        else:                                # the last element-wise node writes t2's output
            renamed[-1] = replace(renamed[-1], outputs=t2.outputs)
            types[t2.outputs[0]] = TensorType(graph.types[t2.outputs[0]].dtype, source_shape)
            replacement = None
    else:
        replacement = replace(t2, inputs=(value if last else t.inputs[0],),
                              attrs={**t2.attrs, "perm": composed})
    return Edit(((t, None), *zip(unary, renamed), (t2, replacement)), types=types)


def _into_dense(graph: GraphEditor, t: Node, layout: "list[Node]", dense: Node, perm) -> Edit:
    source = t.inputs[0]
    shape = graph.types[source].shape
    order = np.arange(int(np.prod(shape))).reshape(shape).transpose(perm).reshape(-1)
    weight = graph.constants[dense.inputs[1]]
    moved = np.empty_like(weight)
    moved[order] = weight                    # row j of W reads element order[j] of the source
    w_name = fresh_name(graph, f"{dense.name}_weight_untransposed")
    flat = layout[-1].outputs[0]
    reshape = Node(layout[0].name, "Reshape", (source,), (flat,),
                   {"shape": tuple(graph.types[flat].shape)})
    # where the rows of the model's weight went (a pre-quantized model's integers follow them)
    earlier = dense.attrs.get("row_order")
    rows = order if earlier is None else order[np.asarray(earlier)]
    folded = replace(dense, inputs=(flat, w_name) + dense.inputs[2:], attrs={
        **dense.attrs, "source_weight": dense.attrs.get("source_weight", dense.inputs[1]),
        "row_order": tuple(int(r) for r in rows)})
    return Edit(((t, None), (layout[0], reshape), *((node, None) for node in layout[1:]),
                 (dense, folded)), {w_name: moved})
