"""Quantization of an accelerator part with host steps in its middle (``graph.meta
["host_steps"]`` entries ``{"at": "middle"}``, :func:`hwonnx.frontend.host.host_steps`): the
part is cut into *segments*, each an ordinary program between host steps, quantized one after
the other by :func:`~hwonnx.quant.ptq.quantize_graph` (``docs/architecture.md``, "Host steps
and program segments").

* **Levels.** A value's level counts the host round trips before it: a graph input is at
  level 0, an accelerator node at the largest level of its inputs, a host step one above the
  largest level of the accelerator values it reads (and at least at the level of the host
  values it reads, so that consecutive host steps make one round trip). Segment ``L`` is the
  accelerator nodes at level ``L``; the host steps of level ``L`` run before it.
* **Calibration.** Every segment is calibrated on the float values of the whole part (the
  float32 host steps included), so a host step's result gets its own scale from the float
  value it has, as every value does.
* **Values crossing a boundary** (a skip connection over a host step, a graph input read by
  two segments, a host result read by two) keep the parameters of their first quantization:
  the later segment is quantized with them given, and reads the same int8 value, which the
  host reads back from the earlier segment and writes again unchanged, so the round trip is
  exact.
"""

import numpy as np

from ..errors import QuantizationError
from ..ir import Graph, Node
from ..ir.evaluate import evaluate_float, first_not_finite
from .calibrate import DEFAULT_METHOD
from .data import calibration_feeds
from .params import activation_params
from .ptq import quantize_graph

__all__ = ["middle_steps", "levels", "quantize_segments"]


def middle_steps(graph: Graph) -> "set[str]":
    """The names of the host steps between accelerator segments."""
    steps = graph.meta.get("host_steps") or {}
    return {name for name, step in steps.items() if step.get("at") == "middle"}


def levels(graph: Graph, host: "set[str]") -> "dict[str, int]":
    """Node name -> level (see the module docstring); ``host``: the host steps' names."""
    level = {v: 0 for v in graph.inputs}
    accelerator: "set[str]" = set()
    result = {}
    for node in graph.nodes:
        reads = [v for v in node.inputs if v and v not in graph.constants]
        if node.name in host:
            here = max((level[v] + (v in accelerator) for v in reads), default=0)
        else:
            here = max((level[v] for v in reads), default=0)
            accelerator.update(node.outputs)
        result[node.name] = here
        level.update((v, here) for v in node.outputs)
    return result


def _float_values(core: Graph, calib) -> "dict[str, np.ndarray]":
    """Every float value of ``core`` on the calibration data (none without data)."""
    if calib is None:
        return {}
    feeds = calibration_feeds(core, calib)
    values = evaluate_float(core, feeds, keep_all=True)
    node = first_not_finite(core, values)
    if node is not None:
        raise QuantizationError(f"Node '{node.name}' ({node.op}) computes inf or NaN on the "
                                f"calibration data: its result is beyond float32")
    return values


def quantize_segments(core: Graph, calib: "dict[str, np.ndarray] | None",
                      method: str = DEFAULT_METHOD) -> Graph:
    """Quantize the accelerator part ``core`` (a float graph from the accelerator's inputs to
    the values the host reads), whose middle may hold host steps.

    Without such steps this is :func:`~hwonnx.quant.ptq.quantize_graph`. Otherwise the integer
    graph holds, level by level, the float host steps of the level, then the segment's
    ``Quantize`` nodes (of the values it reads for the first time), its integer nodes and the
    ``Dequantize`` of the values the host or the graph's outputs read; ``meta["segments"]``
    lists each segment: its integer ``nodes``, its ``inputs`` ``[float value, int8 value,
    scale, zero point]`` and ``outputs`` ``[int8 value, float value, scale, zero point]``,
    every int8 value the host writes or reads. When all the host steps run before or after
    a single segment, the graph is an ordinary one (no ``segments``): its host steps run
    around the program as a prefix and a suffix do.
    """
    host = middle_steps(core)
    if not host:
        return quantize_graph(core, calib, method)
    level = levels(core, host)
    values = _float_values(core, calib)
    nodes: "list[Node]" = []
    types, constants = dict(core.types), dict(core.constants)
    quantized: "dict[str, tuple[str, float, int]]" = {}      # float value -> int8, params
    segments, metas = [], []
    for here in range(max(level.values()) + 1):
        nodes += [n for n in core.nodes if n.name in host and level[n.name] == here]
        body = [n for n in core.nodes if n.name not in host and level[n.name] == here]
        if not body:
            continue
        produced = {v for n in body for v in n.outputs}
        inputs = list(dict.fromkeys(v for n in body for v in n.inputs
                                    if v and v not in core.constants and v not in produced))
        read_after = {v for n in core.nodes if n not in body for v in n.inputs}
        outputs = [v for n in body for v in n.outputs
                   if v in read_after or v in core.outputs]
        meta = dict(core.meta)
        given = {v: quantized[v][1:] for v in inputs if v in quantized}
        for v in inputs:        # a host result constant on the calibration data (a Softmax
            if v not in quantized and v not in core.inputs and values \
                    and np.ptp(values[v]) == 0:         # over one channel) has its range
                given[v] = activation_params(values[v].min(), values[v].max(), f"'{v}'")
        if given:
            ann = dict(meta.get("quantization") or {})
            ann["activations"] = {**ann.get("activations", {}), **given}
            meta["quantization"] = ann
        part = quantize_graph(Graph(body, inputs, outputs, core.types, core.constants, meta),
                              {v: values[v] for v in inputs} if values else None, method)
        metas.append(part.meta)
        ports_in, ports_out, names = [], [], []
        for node in part.nodes:
            if node.op == "Quantize":
                v, q = node.inputs[0], node.outputs[0]
                scale, zp = float(node.attrs["scale"]), int(node.attrs["zero_point"])
                if v in quantized:      # quantized before with the same parameters
                    if quantized[v] != (q, scale, zp):       # a bug
                        raise ValueError(f"'{v}' quantized as {quantized[v]}, not "
                                         f"{(q, scale, zp)}")
                    ports_in.append([v, q, scale, zp])
                    continue
                quantized[v] = (q, scale, zp)
                ports_in.append([v, q, scale, zp])
            elif node.op == "Dequantize":
                q, v = node.inputs[0], node.outputs[0]
                scale, zp = float(node.attrs["scale"]), int(node.attrs["zero_point"])
                quantized[v] = (q, scale, zp)
                ports_out.append([q, v, scale, zp])
            else:
                names.append(node.name)
            nodes.append(node)
        types.update(part.types)
        constants.update(part.constants)
        segments.append({"nodes": names, "inputs": ports_in, "outputs": ports_out,
                         "level": here})
    # Drop a Dequantize nothing reads (a value read back only to be written again).
    read = set(core.outputs)
    kept = []
    for node in reversed(nodes):
        if node.op == "Dequantize" and node.outputs[0] not in read:
            continue
        read.update(node.inputs)
        kept.append(node)
    meta = dict(metas[0])
    meta["warnings"] = tuple(dict.fromkeys(w for m in metas for w in m.get("warnings", ())))
    meta["layer_check"] = tuple(row for m in metas for row in m.get("layer_check", ()))
    if len(segments) > 1:
        meta["segments"] = tuple({k: v for k, v in s.items() if k != "level"}
                                 for s in segments)
    else:                       # host steps only before or after one segment: no split
        steps = dict(meta.get("host_steps") or {})
        for name in host:
            where = ("before the accelerator's input" if level[name] <= segments[0]["level"]
                     else "after the accelerator's output")
            why = steps[name]["why"].split("; ")[0]
            steps[name] = {"at": "middle", "why": f"{why}; {where} (one accelerator segment: "
                                                 f"no round trip)"}
        meta["host_steps"] = steps
    result = Graph(kept[::-1], core.inputs, core.outputs, types, constants, meta)
    result.verify()
    return result
