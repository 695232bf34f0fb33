"""``batchnorm-to-conv``: turn a ``BatchNorm`` that ``fold-batchnorm`` could not fold into a
depthwise 1x1 ``Conv`` (4-D input) or a diagonal ``Dense`` (``[1, C]`` input)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import (Edit, GraphEditor, channel_scale_node, channel_weight, fresh_name,
                      rewrite_each)

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["BatchNormToConv"]


@dataclass(frozen=True)
class BatchNormToConv:
    """Replace ``BatchNorm(x, scale, B, mean, var)`` with constant per-channel parameters by a
    node computing the same affine map: with ``s = scale / sqrt(var + epsilon)``, a ``Conv``
    with ``group = C``, weight ``s`` as ``[C, 1, 1, 1]`` and bias ``B - mean * s`` for a 4-D
    ``x``, or a ``Dense`` with weight ``diag(s)`` and the same bias for a ``[1, C]`` ``x``
    (computed in float64, stored as float32). The node keeps the ``BatchNorm``'s name and output
    and starts without activation, so ``fuse-bias``, ``fuse-relu`` and ``fuse-clip`` apply to it.

    Runs after ``fold-batchnorm``, so only a ``BatchNorm`` that could not be folded into a
    ``Conv``/``Dense`` before it is converted; any other ``BatchNorm`` is left alone.
    """
    name: str = "batchnorm-to-conv"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        return rewrite_each(graph, _convert)


def _convert(graph: GraphEditor, bn: Node) -> "Edit | None":
    if bn.op != "BatchNorm" or not all(v in graph.constants for v in bn.inputs[1:5]):
        return None
    shape = tuple(graph.types[bn.inputs[0]].shape)
    if len(shape) < 2:
        return None
    channels = shape[1]
    scale, bias, mean, var = (graph.constants[v].astype(np.float64) for v in bn.inputs[1:5])
    if any(p.shape != (channels,) for p in (scale, bias, mean, var)):
        return None
    s = scale / np.sqrt(var + bn.attrs["epsilon"])
    w_name = fresh_name(graph, f"{bn.name}_weight")
    b_name = fresh_name(graph, f"{bn.name}_bias")
    node = channel_scale_node(bn.name, (bn.inputs[0], w_name, b_name), bn.outputs[0], shape)
    if node is None:
        return None
    constants = {w_name: channel_weight(shape, s), b_name: (bias - mean * s).astype(np.float32)}
    return Edit(((bn, node),), constants)
