"""``fold-batchnorm``: fold inference-mode ``BatchNorm`` into the preceding ``Conv``/``Dense``,
also through layout nodes (``Reshape``, ``Flatten``) that the fold can follow."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import (Edit, GraphEditor, fold_channel_affine, has_activation, per_channel,
                      rewrite_each, through_layout)

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["FoldBatchNorm"]


@dataclass(frozen=True)
class FoldBatchNorm:
    """Fold ``BatchNorm`` whose input is written by a ``Conv`` (any ``group``) or ``Dense``
    (without fused ReLU or ``act_max``) that nothing else reads and that a pre-quantized
    model does not quantize (``PassContext.quantized``: there the model rounds the layer's
    output before the ``BatchNorm``, so folding would change its result): with
    ``s = scale / sqrt(var + epsilon)``, output channel ``m`` of the weights is scaled by
    ``s[m]`` and the layer bias becomes ``(bias - mean) * s + B`` (``B``: the BatchNorm
    offset).

    Layout nodes (``Reshape``, ``Flatten``: also ONNX ``Squeeze``, ``Unsqueeze`` and a
    ``Transpose`` of size-1 axes) may sit between the layer and the ``BatchNorm``, each read
    only by the next and none quantized by the model, when every element of a layer channel
    meets the same ``BatchNorm`` channel (PyTorch's ``BatchNorm1d`` as
    ``Gemm -> Unsqueeze -> BatchNormalization -> Squeeze``): the layout nodes stay, the last
    writing the ``BatchNorm``'s output.

    A ``BatchNorm`` that cannot be folded is left alone.
    """
    name: str = "fold-batchnorm"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, lambda g, node: _fold(g, node, ctx.quantized))


def _fold(graph: GraphEditor, bn: Node, quantized: "frozenset[str]") -> "Edit | None":
    if bn.op != "BatchNorm":
        return None
    producer, chain, values = through_layout(graph, bn.inputs[0], bn)
    if producer is None or producer.op not in ("Conv", "Dense") or has_activation(producer) \
            or any(v in quantized for v in values) \
            or not all(v in graph.constants for v in (*bn.inputs[1:], *producer.inputs[1:])):
        return None
    shape = tuple(graph.types[bn.inputs[0]].shape)
    target = tuple(graph.types[producer.outputs[0]].shape)
    if len(shape) < 2:
        return None
    scale, bias, mean, var = (graph.constants[v].astype(np.float64) for v in bn.inputs[1:5])
    if any(p.shape != (shape[1],) for p in (scale, bias, mean, var)):
        return None
    s = scale / np.sqrt(var + bn.attrs["epsilon"])       # var + epsilon > 0: the converter
    on_axis = (1, shape[1]) + (1,) * (len(shape) - 2)
    s, bias, mean = (per_channel(p.reshape(on_axis), shape, target) for p in (s, bias, mean))
    if s is None or bias is None or mean is None:
        return None
    return fold_channel_affine(graph, producer, chain, bn, s,
                               lambda old: (old - mean) * s + bias,
                               f"BatchNormalization '{bn.name}'")
