"""Evaluate an integer graph with the golden ops."""

import numpy as np

from ..ir import Graph
from .ops import GOLDEN_OPS

__all__ = ["evaluate"]


def evaluate(graph: Graph, feeds: "dict[str, np.ndarray]", keep_all: bool = False
             ) -> "dict[str, np.ndarray]":
    """Run ``graph`` on ``feeds`` (a leading sample axis is allowed) and return its outputs,
    or every value when ``keep_all`` (used to find the first differing layer). A node
    whose outputs are all in ``feeds`` is skipped, so integer values can be fed directly."""
    env = {**graph.constants, **feeds}
    for node in graph.nodes:
        if all(v in feeds for v in node.outputs):
            continue                      # fed directly (e.g. already-quantized inputs)
        if node.op not in GOLDEN_OPS:  # the quantizer emits only golden ops: this is a bug
            raise NotImplementedError(f"No golden model for IR op {node.op} "
                                      f"(node '{node.name}')")
        args = [env[v] for v in node.inputs]
        env[node.outputs[0]] = GOLDEN_OPS[node.op](*args, **dict(node.attrs))
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}
