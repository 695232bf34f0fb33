"""``fold-batchnorm``: fold inference-mode ``BatchNorm`` into the preceding ``Conv``/``Dense``."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelError
from ..ir.graph import Graph, Node
from .rewrite import fresh_name, fuse_into_producer, has_activation, rewrite_each, sole_consumer

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

    A ``BatchNorm`` that cannot be folded is left alone.
    """
    name: str = "fold-batchnorm"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, lambda g, node: _fold(g, node, ctx.quantized))


def _fold(graph: Graph, bn: Node, quantized: "frozenset[str]") -> "Graph | None":
    if bn.op != "BatchNorm" or bn.inputs[0] in quantized:
        return None
    producer = graph.producer(bn.inputs[0])
    if producer is None or producer.op not in ("Conv", "Dense") or has_activation(producer) \
            or sole_consumer(graph, bn.inputs[0]) is not bn \
            or not all(v in graph.constants for v in (*bn.inputs[1:], *producer.inputs[1:])):
        return None
    weight = graph.constants[producer.inputs[1]].astype(np.float64)
    channels = weight.shape[0] if producer.op == "Conv" else weight.shape[1]
    scale, bias, mean, var = (graph.constants[v].astype(np.float64) for v in bn.inputs[1:5])
    if any(p.shape != (channels,) for p in (scale, bias, mean, var)):
        return None
    s = scale / np.sqrt(var + bn.attrs["epsilon"])       # var + epsilon > 0: the converter
    weight = weight * (s[:, None, None, None] if producer.op == "Conv" else s[None, :])
    old_bias = graph.constants[producer.inputs[2]].astype(np.float64) \
        if len(producer.inputs) > 2 else np.zeros(channels)
    new_bias = (old_bias - mean) * s + bias
    limit = np.finfo(np.float32).max
    if not (np.abs(weight) <= limit).all() or not (np.abs(new_bias) <= limit).all():
        raise ModelError(f"BatchNormalization '{bn.name}' folded into {producer.op} "
                         f"'{producer.name}' gives weights or a bias beyond float32")
    w_name = fresh_name(graph, f"{producer.name}_weight_bn")
    b_name = fresh_name(graph, f"{producer.name}_bias_bn")
    fused = replace(producer, inputs=(producer.inputs[0], w_name, b_name), outputs=bn.outputs)
    return fuse_into_producer(graph, producer, bn, fused, {
        w_name: weight.astype(np.float32),
        b_name: new_bias.astype(np.float32),
    })
