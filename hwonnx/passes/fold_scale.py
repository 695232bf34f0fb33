"""``fold-scale``: fold a per-channel scale (a run-time ``Mul`` by a constant, which the
frontend makes a diagonal ``Dense`` or a depthwise 1x1 ``Conv``) into the preceding
``Conv``/``Dense``, also through layout nodes the fold can follow."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import (Edit, GraphEditor, fold_channel_affine, has_activation, per_channel,
                      rewrite_each, through_layout)

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FoldScale"]


@dataclass(frozen=True)
class FoldScale:
    """Fold a scale node ``y = x * d[c] + e[c]`` (``e``: its bias, or 0) into the ``Conv``
    (any ``group``) or ``Dense`` writing ``x`` (without fused ReLU or ``act_max``, read by
    nothing else, constant weights): output channel ``m`` of the weights is scaled by
    ``d[m]`` and the bias becomes ``bias * d + e``; the layer takes the scale node's ``relu``
    and ``act_max``. A scale node is a ``Dense`` with a square diagonal weight (the
    frontend's ``Mul`` of a ``[1, K]`` tensor) or a ``Conv`` with ``group = C``, weight
    ``[C, 1, 1, 1]``, unit strides and dilations and no padding (its ``Mul`` of a 4-D
    tensor); either computes that map exactly, so folding it changes no float result.

    As for ``fold-batchnorm``, layout nodes (``Reshape``, ``Flatten``) may sit between the
    two when every element of a layer channel meets the same scale, and no value between
    them may be quantized by a pre-quantized model (``PassContext.quantized``). Keras's
    BatchNormalization after a Dense exports as ``Mul`` and ``Add`` by constants: this pass
    folds the ``Mul`` (with the ``Add`` that ``fuse-bias``, run before, put in its bias).

    Runs after ``batchnorm-to-conv``, whose nodes are scale nodes too: it folds one only where
    ``fold-batchnorm`` could have folded the ``BatchNorm`` (e.g. after an ``Add`` that
    ``fuse-bias`` has since folded), never across a quantized value or an activation.
    """
    name: str = "fold-scale"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, lambda g, node: _fold(g, node, ctx.quantized))


def _scale(graph: GraphEditor, node: Node) -> "tuple[np.ndarray, np.ndarray] | None":
    """``(d, e)`` of a scale node, shaped to broadcast against its input; None otherwise."""
    if node.op not in ("Conv", "Dense") or \
            not all(v in graph.constants for v in node.inputs[1:]):
        return None
    weight = graph.constants[node.inputs[1]].astype(np.float64)
    shape = tuple(graph.types[node.inputs[0]].shape)
    if node.op == "Dense":
        if weight.ndim != 2 or weight.shape[0] != weight.shape[1] \
                or np.count_nonzero(weight - np.diag(np.diag(weight))):
            return None
        d = np.diag(weight).reshape(1, -1)
    else:
        attrs = node.attrs
        if len(shape) != 4 or weight.shape != (shape[1], 1, 1, 1) \
                or attrs["group"] != shape[1] or tuple(attrs["strides"]) != (1, 1) \
                or tuple(attrs["dilations"]) != (1, 1) or any(attrs["pads"]) \
                or attrs.get("pad_value") is not None:
            return None
        d = weight.reshape(1, -1, 1, 1)
    e = graph.constants[node.inputs[2]].astype(np.float64).reshape(d.shape) \
        if len(node.inputs) > 2 else np.zeros(d.shape)
    return d, e


def _fold(graph: GraphEditor, node: Node, quantized: "frozenset[str]") -> "Edit | None":
    found = _scale(graph, node)
    if found is None:
        return None
    producer, chain, values = through_layout(graph, node.inputs[0], node)
    if producer is None or producer.op not in ("Conv", "Dense") or has_activation(producer) \
            or any(v in quantized for v in values) \
            or not all(v in graph.constants for v in producer.inputs[1:]):
        return None
    shape = tuple(graph.types[node.inputs[0]].shape)
    target = tuple(graph.types[producer.outputs[0]].shape)
    d, e = (per_channel(p, shape, target) for p in found)
    if d is None or e is None:
        return None
    return fold_channel_affine(graph, producer, chain, node, d, lambda old: old * d + e,
                               f"The scale {node.op} '{node.name}'",
                               {"relu": bool(node.attrs.get("relu")),
                                "act_max": node.attrs.get("act_max")})
