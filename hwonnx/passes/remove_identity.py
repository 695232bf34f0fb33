"""``remove-identity``: delete ``Identity`` nodes."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..ir.graph import Graph
from .rewrite import prune

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["RemoveIdentity"]


@dataclass(frozen=True)
class RemoveIdentity:
    """Delete ``Identity`` nodes, renaming values so that graph output names stay the same.

    ``y = Identity(x)`` is removed by making the readers of ``y`` read ``x``; when ``y`` is a
    graph output, the producer of ``x`` writes ``y`` instead. An ``Identity`` that copies a
    graph input, a constant or another graph output to a graph output is kept.

    The nodes are visited once, in order, and every renaming is applied in one final sweep,
    so a chain of ``n`` identities takes time linear in the size of the graph.
    """
    name: str = "remove-identity"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        outputs = set(graph.outputs)
        produced = {value for node in graph.nodes for value in node.outputs}
        alias: "dict[str, str]" = {}         # value -> the value its readers read instead
        written: "dict[str, str]" = {}       # value -> the graph output its producer writes

        def resolve(value: str) -> str:
            while value in alias:
                value = alias[value]
            return value

        removed = set()
        for index, node in enumerate(graph.nodes):
            if node.op != "Identity":
                continue
            source, target = resolve(node.inputs[0]), node.outputs[0]
            if target not in outputs:
                alias[target] = source
            elif source in outputs or source not in produced:
                continue                     # a copy of an input, constant or output: kept
            else:
                alias[source] = written[source] = target   # a second copy is then kept
            removed.add(index)
        if not removed:
            return graph
        nodes = []
        for index, node in enumerate(graph.nodes):
            if index in removed:
                continue
            inputs = tuple(resolve(v) for v in node.inputs)
            outs = tuple(written.get(v, v) for v in node.outputs)
            nodes.append(node if (inputs, outs) == (node.inputs, node.outputs) else
                         replace(node, inputs=inputs, outputs=outs))
        return prune(replace(graph, nodes=nodes))
