"""``remove-identity``: delete ``Identity`` nodes."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..ir.graph import Graph, Node
from .rewrite import prune

if TYPE_CHECKING:
    from .pipeline import PassContext

__all__ = ["RemoveIdentity"]


def _rename(nodes, old: str, new: str) -> "tuple[Node, ...]":
    return tuple(replace(n, inputs=tuple(new if v == old else v for v in n.inputs),
                         outputs=tuple(new if v == old else v for v in n.outputs))
                 if old in n.inputs or old in n.outputs else n for n in nodes)


@dataclass(frozen=True)
class RemoveIdentity:
    """Delete ``Identity`` nodes, renaming values so that graph output names stay the same.

    ``y = Identity(x)`` is removed by making the readers of ``y`` read ``x``; when ``y`` is a
    graph output, the producer of ``x`` writes ``y`` instead. An ``Identity`` that copies a
    graph input, a constant or another graph output to a graph output is kept.
    """
    name: str = "remove-identity"

    def __call__(self, graph: Graph, ctx: "PassContext") -> Graph:
        kept: "set[str]" = set()
        for _ in range(len(graph.nodes)):
            node = next((n for n in graph.nodes if n.op == "Identity"
                         and n.outputs[0] not in kept), None)
            if node is None:
                break
            new = self._remove(graph, node)
            if new is None:
                kept.add(node.outputs[0])
            else:
                graph = new
        return graph

    @staticmethod
    def _remove(graph: Graph, node: Node) -> "Graph | None":
        source, target = node.inputs[0], node.outputs[0]
        nodes = tuple(n for n in graph.nodes if n is not node)
        if target not in graph.outputs:
            return prune(replace(graph, nodes=_rename(nodes, target, source)))
        if source in graph.outputs or graph.producer(source) is None:
            return None
        return prune(replace(graph, nodes=_rename(nodes, source, target)))
