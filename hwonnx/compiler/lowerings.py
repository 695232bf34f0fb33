"""How each integer array op is lowered: :data:`LOWERINGS`, registered with :func:`lowering`
as the golden functions are with :func:`~hwonnx.golden.ops.golden_op`.
``tests/ir/test_registry.py`` checks that every integer array op of the operator registry
(:mod:`hwonnx.ir.ops`) has a lowering and no other op does.

A lowering takes the :class:`~.emitter.TileEmitter`, the node, its sources' placements and its
output's placement, and returns a function per part of the layer that emits that part and
returns its plan (:meth:`~.emitter.TileEmitter.layer_parts`). Most ops are one array layer, a
convolution over their sources: their :class:`~.specs.LayerSpec` goes to
:meth:`~.emitter.TileEmitter.one_layer`; an op written by several layers, each to its own
output pixels, gives its named specs to :meth:`~.emitter.TileEmitter.several_layers`;
``QEltwise`` runs on the element-wise engine (:mod:`.eltwise`)."""

from typing import Callable

from ..ir import Node
from .eltwise import emit_eltwise
from .layout import Placement
from .specs import (add_spec, channel_permute_spec, concat_hw_specs, concat_spec, conv_spec,
                    dense_spec, permute_specs, phase_specs, pool_spec, slice_spec)
from .split import concat_parts

__all__ = ["LOWERINGS", "lowering"]

#: Integer array op -> its lowering ``fn(emitter, node, sources, target) -> [emit part]``.
LOWERINGS: "dict[str, Callable[..., list]]" = {}


def lowering(*ops: str):
    """Register the decorated function as the lowering of ``ops``."""
    def register(fn):
        for op in ops:
            LOWERINGS[op] = fn
        return fn
    return register


@lowering("QConv")
def lower_conv(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return emitter.one_layer(node, conv_spec(node, sources, emitter.graph, emitter.rows), target)


@lowering("QDense")
def lower_dense(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return emitter.one_layer(node, dense_spec(node, sources, emitter.graph, emitter.rows),
                             target)


@lowering("QAdd")
def lower_add(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return emitter.one_layer(node, add_spec(node, sources, emitter.graph, emitter.rows), target)


@lowering("QAvgPool", "QMaxPool")
def lower_pool(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return emitter.one_layer(node, pool_spec(node, sources, emitter.graph, emitter.rows), target)


@lowering("QSlice")
def lower_slice(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return emitter.one_layer(node, slice_spec(node, sources, emitter.graph, emitter.rows),
                             target)


@lowering("QChannelPermute")
def lower_channel_permute(emitter, node: Node, sources: "list[Placement]", target: Placement
                          ) -> list:
    return emitter.one_layer(
        node, channel_permute_spec(node, sources, emitter.graph, emitter.rows), target)


@lowering("QConcat")
def lower_concat(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    """Along height or width, one layer per source; along the channels one layer, in parts of
    the sources' channels where the output is an image (:func:`~.split.concat_parts`)."""
    rows = emitter.rows
    if node.attrs.get("axis", 1) != 1:
        return emitter.several_layers(node, concat_hw_specs(node, sources, emitter.graph, rows),
                                      target)
    spec = concat_spec(node, sources, emitter.graph, rows)
    return emitter.one_layer(node, spec, target, lambda: concat_parts(spec, rows)
                             if target.is_natural_image(rows) else None)


@lowering("QConvTranspose")
def lower_conv_transpose(emitter, node: Node, sources: "list[Placement]", target: Placement
                         ) -> list:
    return emitter.several_layers(node, phase_specs(node, sources, emitter.graph, emitter.rows),
                                  target)


@lowering("QPermute")
def lower_permute(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return emitter.several_layers(
        node, permute_specs(node, sources, emitter.graph, emitter.rows), target)


@lowering("QEltwise")
def lower_eltwise(emitter, node: Node, sources: "list[Placement]", target: Placement) -> list:
    return [lambda: emit_eltwise(emitter, node, sources, target)]
