"""Evaluate an integer graph with the golden ops."""

import numpy as np

from ..ir import Graph
from .host import HOST_FUNCTIONS, run_host
from .ops import GOLDEN_OPS, lookup

__all__ = ["evaluate"]


def evaluate(graph: Graph, feeds: "dict[str, np.ndarray]", keep_all: bool = False,
             downstream: bool = False) -> "dict[str, np.ndarray]":
    """Run ``graph`` on ``feeds`` (a leading sample axis is allowed) and return its outputs,
    or every value when ``keep_all`` (used to find the first differing layer). A node
    whose outputs are all in ``feeds`` is skipped, so integer values can be fed directly.
    With ``downstream``, only nodes computable from ``feeds`` run (the host steps after the
    accelerator's output, fed with the RTL's result); every graph output must still come
    out. Host steps (:mod:`.host`) run sample by sample."""
    env = {**graph.constants, **feeds}
    counts = {np.shape(a)[0] for v, a in feeds.items() if v not in graph.constants and np.ndim(a)}
    if len(counts) > 1:
        raise ValueError(f"Feeds hold different sample counts: {sorted(counts)}")
    count = counts.pop() if counts else None
    for node in graph.nodes:
        if all(v in feeds for v in node.outputs):
            continue                      # fed directly (e.g. already-quantized inputs)
        if downstream and not all(v in env for v in node.inputs if v):
            continue                      # upstream of the fed values: not asked for
        args = [env[v] for v in node.inputs]
        _check_inputs(graph, node, args, count)
        if node.op in HOST_FUNCTIONS:
            env.update(zip(node.outputs, run_host(node, args, [v not in graph.constants
                                                               for v in node.inputs],
                                                  graph.types)))
            continue
        if node.op not in GOLDEN_OPS:  # the quantizer emits only golden ops: this is a bug
            raise NotImplementedError(f"No golden model for IR op {node.op} "
                                      f"(node '{node.name}')")
        env[node.outputs[0]] = GOLDEN_OPS[node.op](*args, **dict(node.attrs))
        if node.attrs.get("table") is not None:      # a fused activation (lookup table)
            env[node.outputs[0]] = lookup(env[node.outputs[0]], node.attrs["table"])
    if keep_all:
        return env
    missing = [name for name in graph.outputs if name not in env]
    if missing:
        raise ValueError(f"Graph outputs {missing} cannot be computed from the fed values")
    return {name: env[name] for name in graph.outputs}


def _check_inputs(graph: Graph, node, args: "list[np.ndarray]", count: "int | None") -> None:
    """Check that each run-time input of ``node`` is a batch of ``count`` samples of its IR
    shape (leading axis 1, the sample axis): the ops run samples along axis 0 and would
    otherwise fail inside NumPy, or mix samples."""
    for name, arg in zip(node.inputs, args):
        if name in graph.constants or name not in graph.types:
            continue
        want, got = tuple(graph.types[name].shape), np.shape(arg)
        if not want:
            continue
        if len(got) != len(want) or got[1:] != want[1:] or (count is not None
                                                           and got[0] != count):
            raise ValueError(f"Node '{node.name}' ({node.op}) reads '{name}' of shape "
                             f"{list(got)}, not a batch of {count if count is not None else 'S'}"
                             f" samples of its IR shape {list(want)}")
