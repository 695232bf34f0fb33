"""Quantization of a float graph with host steps at its start and end (``graph.meta
["host_steps"]``, decided by :func:`hwonnx.frontend.host.host_steps`): the host prefix runs in
float32 on the calibration data, the accelerator part between the two is quantized by
:func:`~hwonnx.quant.ptq.quantize_graph`, and the host steps are put back around it."""

from dataclasses import dataclass, replace

import numpy as np

from ..errors import ModelError, QuantizationError, UnsupportedOperatorError
from ..ir import Graph, Node
from ..ir.evaluate import evaluate_float, first_not_finite
from .calibrate import DEFAULT_METHOD
from .data import calibration_feeds
from .segments import quantize_segments

__all__ = ["HostSplit", "split_host", "quantize_model"]


@dataclass(frozen=True)
class HostSplit:
    """A float graph cut into the host steps before the accelerator (``prefix``), the
    accelerator part (``core``, a graph from the accelerator's input to the values the host
    reads back) and the host steps after it (``suffix``)."""
    prefix: "tuple[Node, ...]"
    core: Graph
    suffix: "tuple[Node, ...]"


def split_host(graph: Graph) -> HostSplit:
    """Cut ``graph`` at its host steps (none when ``graph.meta`` names none)."""
    steps = graph.meta.get("host_steps") or {}
    prefix = tuple(n for n in graph.nodes if steps.get(n.name, {}).get("at") == "start")
    suffix = tuple(n for n in graph.nodes if steps.get(n.name, {}).get("at") == "end")
    host = {n.name for n in prefix + suffix}
    core_nodes = [n for n in graph.nodes if n.name not in host]
    # Each graph input's accelerator input: the input itself, or the last value of its host
    # prefix (each input has its own leading chain, one run-time value wide).
    root = {name: name for name in graph.inputs}
    for node in prefix:
        source = next(root[v] for v in node.inputs if v in root)
        root.update((v, source) for v in node.outputs)
    read = {v for n in core_nodes for v in n.inputs}
    inputs = tuple(sorted((v for v in root if v in read),
                          key=lambda v: graph.inputs.index(root[v]))) if prefix else graph.inputs
    ends = {root[v] for v in inputs}
    stranded = [n for n in prefix if root[n.outputs[0]] not in ends]
    if stranded:
        raise UnsupportedOperatorError([(n.name, f"{n.op} (the model has no node for the "
                                         f"accelerator after this host step)", "",
                                         graph.meta.get("opset", 0)) for n in stranded[-1:]])
    if len(inputs) != len(ends):      # each leading chain ends in exactly one such value
        raise ValueError(f"Host prefix of {[n.name for n in prefix]} feeds {list(inputs)}")
    produced = set(inputs) | {v for n in core_nodes for v in n.outputs}
    wanted = [v for n in suffix for v in n.inputs] + list(graph.outputs)
    outputs = tuple(dict.fromkeys(v for v in wanted if v in produced))
    core = Graph(core_nodes, inputs, outputs, graph.types, graph.constants, graph.meta)
    return HostSplit(prefix, core, suffix)


def _host_adds(graph: Graph) -> Graph:
    """``graph`` with every ``Add`` of a constant that the ``fuse-bias`` pass could not fold
    into a bias, and that is no host step at the start, made a host step between accelerator
    segments (the array has no mapping for it; the host adds in float32)."""
    steps = dict(graph.meta.get("host_steps") or {})
    adds = [n for n in graph.nodes if n.op == "Add" and n.name not in steps
            and any(v in graph.constants for v in n.inputs)]
    if not adds:
        return graph
    for node in adds:
        steps[node.name] = {"at": "middle", "why": (
            "Add of a constant that no bias of a Conv or Gemm right before it absorbs has no "
            "hardware mapping; between accelerator segments: the host reads its input back "
            "and writes its result, quantized, into the next segment")}
    return replace(graph, meta={**graph.meta, "host_steps": steps})


def _check_batch_axis(graph: Graph) -> None:
    """Refuse a graph input, or a reshape computed on the accelerator, whose shape does not
    start with the batch axis of size 1: calibration and golden runs evaluate many samples at
    once along it."""
    for name in graph.inputs:
        shape = list(graph.types[name].shape)
        if not shape or shape[0] != 1:
            raise ModelError(f"Graph input '{name}' has shape {shape}; hwonnx runs samples "
                             f"along a leading batch axis of size 1 (such as [1, 3, 32, 32])")
    for node in graph.nodes:
        shape = list(graph.types[node.outputs[0]].shape) if node.outputs else []
        if node.op in ("Reshape", "Flatten") and (not shape or shape[0] != 1):
            error = UnsupportedOperatorError([(node.name, node.op, "",
                                               graph.meta.get("opset", 0))])
            error.args = (f"{error} ('{node.name}' reshapes "
                          f"{list(graph.types[node.inputs[0]].shape)} to {shape}, dropping the "
                          f"leading batch axis of size 1, along which hwonnx runs samples)",)
            raise error


def quantize_model(graph: Graph, calib: "dict[str, np.ndarray] | None",
                   method: str = DEFAULT_METHOD) -> Graph:
    """Quantize a float graph whose start and end may hold host steps.

    The integer graph has the float host prefix (reading the graph inputs), then the
    ``Quantize`` of its result, the accelerator's nodes, the ``Dequantize`` of the values the
    host suffix reads (named as in the float graph), and the float host suffix, which writes
    the graph outputs (an ``ArgMax`` or ``TopK`` index output is int64). ``calib`` is as for
    :func:`~hwonnx.quant.ptq.quantize_graph`; the prefix runs on it in float32 to calibrate
    the accelerator's input; ``method`` is the calibration method
    (:data:`~hwonnx.quant.calibrate.METHODS`).
    """
    _check_batch_axis(graph)
    constant = [v for v in graph.outputs if v in graph.constants]
    if constant:
        raise ModelError(f"Graph output '{constant[0]}' is a constant: it does not depend on "
                         f"the graph input, and hwonnx computes every output from the input "
                         f"(drop the output, or compute it outside the model)")
    graph = _host_adds(graph)
    split = split_host(graph)
    if not split.prefix and not split.suffix:
        return quantize_segments(graph, calib, method)
    core_calib = calib
    if calib is not None and split.prefix:
        feeds = calibration_feeds(graph, calib)
        prefix = Graph(split.prefix, graph.inputs, split.core.inputs, graph.types,
                       graph.constants)
        values = evaluate_float(prefix, feeds, keep_all=True)
        node = first_not_finite(prefix, values)
        if node is not None:
            raise QuantizationError(f"Host step '{node.name}' ({node.op}) computes inf or NaN "
                                    f"on the calibration data: its result is beyond float32")
        core_calib = {value: values[value] for value in split.core.inputs}
    core = quantize_segments(split.core, core_calib, method)
    host = split.prefix + split.suffix
    # in graph order, not a set's: the build folder's graph.json and graph.npz list them so
    values = dict.fromkeys([*graph.inputs, *(v for n in host for v in (*n.inputs, *n.outputs))])
    types = {v: graph.types[v] for v in values if v in graph.types}
    constants = {v: graph.constants[v] for v in values if v in graph.constants}
    result = Graph(split.prefix + tuple(core.nodes) + split.suffix, graph.inputs,
                   graph.outputs, {**types, **core.types}, {**constants, **core.constants},
                   core.meta)
    result.verify()
    return result
