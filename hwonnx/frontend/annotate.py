"""The quantization annotations of a pre-quantized model (see :mod:`.prequant`): what the
model says about its integers, and ``graph.meta["quantization"]`` built from it after the
float pass pipeline, keyed by the final value and constant names."""

from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph
from ..ir.ops import LAYER, ir_ops, keeps_input_params
from .upsample import conv_layout

__all__ = ["Annotations", "IntegerConstant", "annotate_graph"]

_LAYERS = ir_ops(LAYER)


@dataclass
class IntegerConstant:
    """A dequantized constant: ``value = (q - zero_point) * scale`` (float32), with ``q`` and
    ``zero_point`` int8 (uint8 shifted by -128) or int32, ``scale`` float32; ``scale`` and
    ``zero_point`` are 0-D, or 1-D along ``axis`` of ``q``."""
    q: np.ndarray
    zero_point: np.ndarray
    scale: np.ndarray
    axis: "int | None"
    value: np.ndarray
    bits: int

    def transposed(self) -> "IntegerConstant":
        axis = None if self.axis is None else 1 - self.axis
        return IntegerConstant(self.q.T, self.zero_point, self.scale, axis, self.value.T,
                               self.bits)

    def channels(self, axis: int) -> "tuple[np.ndarray, np.ndarray] | None":
        """``(scale, zero_point)`` per index of ``axis``, None when quantized along another."""
        if self.axis not in (None, axis):
            return None
        count = self.q.shape[axis]
        return (np.broadcast_to(self.scale.reshape(-1), (count,)).astype(np.float64),
                np.broadcast_to(self.zero_point.reshape(-1), (count,)).astype(np.int64))


@dataclass
class Annotations:
    """What the model says about its quantization: ``activations`` maps value names to
    ``(scale, zero_point)`` (int8 zero point), ``ranges`` maps value names to the int8 clamp
    range ``(lo, hi)`` of a tensor quantized to fewer than 8 bits or a narrow range (QCDQ's
    ``Clip``, QONNX's ``Quant``), ``integers`` maps the names of dequantized float constants
    to their :class:`IntegerConstant`; ``quantizers`` describes a QONNX model's quantizers,
    ``half_up`` names the values it requantizes half up and ``signs`` maps the values it
    quantizes to ``±1`` by their sign to ``(mode, quantizer node)`` (see
    :func:`.qonnx.rewrite_qonnx`)."""
    source: str
    activations: "dict[str, tuple[float, int]]" = field(default_factory=dict)
    integers: "dict[str, IntegerConstant]" = field(default_factory=dict)
    ranges: "dict[str, tuple[int, int]]" = field(default_factory=dict)
    quantizers: "list[dict]" = field(default_factory=list)
    half_up: "set[str]" = field(default_factory=set)
    signs: "dict[str, tuple[str, str]]" = field(default_factory=dict)


def annotate_graph(graph: Graph, ann: Annotations) -> Graph:
    """Return ``graph`` (the float graph after the pass pipeline) with
    ``meta["quantization"]`` built from ``ann``, keyed by the graph's value and constant
    names, and with ``relu=True`` on every layer whose annotated output range starts at
    real 0 (int8 zero point -128, or a clamp range starting at the zero point): the clipping
    of a ReLU that onnxruntime's quantizer removed because the quantized range already clips;
    a clamp range below int8's top also sets ``act_max`` (its real maximum), so that the float
    graph clips where the quantizer does.

    ``meta["quantization"]``: ``activations`` (value -> ``(scale, zero_point)``; a value
    that a copy (``Permute``, ``Slice``, ``MaxPool``, a ``copy`` layer) makes of an annotated
    one has its parameters),
    ``weights`` (``Conv``/``Dense`` weight constant -> ``{"q", "scale", "zero_point"}``,
    ``q`` int8 in the constant's layout, ``scale`` and ``zero_point`` per output channel),
    ``bias`` (bias constant -> int32 per output channel, in units of input scale x weight
    scale), ``ranges`` (value -> int8 clamp range), ``source`` (``"qdq"``, ``"qoperator"`` or
    ``"qonnx"``), ``half_up`` and ``signs`` (:class:`Annotations`). A QONNX model's
    quantizers go to ``meta["quantizers"]``.
    """
    values = set(graph.inputs) | {v for node in graph.nodes for v in node.outputs}
    activations = {v: p for v, p in ann.activations.items() if v in values}
    for node in graph.nodes:     # copies the passes made (a channels-last Resize's Permutes)
        if node.inputs and node.outputs and node.inputs[0] in activations and \
                node.outputs[0] not in activations and keeps_input_params(node):
            activations[node.outputs[0]] = activations[node.inputs[0]]
    ranges = {v: r for v, r in ann.ranges.items() if v in values}
    weights, bias, notes, nodes = {}, {}, [], []
    for node in graph.nodes:
        if node.op in ("Conv", "Dense", "ConvTranspose") and not node.attrs.get("copy"):
            record = _weight_annotation(graph, node, ann)
            if record is None:
                notes.append(f"The weights of '{node.name}' carry no usable integers; "
                             f"hwonnx quantizes them itself (int8 symmetric per channel)")
            else:
                weights[node.inputs[1]] = record
                q_bias = _bias_annotation(graph, node, ann, activations, record)
                if q_bias is not None:
                    bias[node.inputs[2]] = q_bias
                elif len(node.inputs) > 2:
                    notes.append(f"The bias of '{node.name}' is requantized from float: the "
                                 f"model gives no int32 bias in units of input scale x weight "
                                 f"scale")
        out = activations.get(node.outputs[0]) if node.outputs else None
        lowest, highest = ranges.get(node.outputs[0], (-128, 127)) if node.outputs \
            else (-128, 127)
        if node.op in _LAYERS and out is not None and highest < 127:
            top = float((highest - out[1]) * np.float64(out[0]))    # the range's real maximum
            old = node.attrs.get("act_max")
            node = node.with_attrs(act_max=top if old is None else min(float(old), top))
        if node.op in _LAYERS and out is not None \
                and max(lowest, -128) == out[1] and not node.attrs.get("relu") \
                and (node.attrs.get("act_max") is None or node.attrs["act_max"] >= 0):
            node = node.with_attrs(relu=True)
        nodes.append(node)
    meta = dict(graph.meta)
    meta["quantization"] = {"activations": activations, "weights": weights, "bias": bias,
                            "ranges": ranges, "source": ann.source,
                            "half_up": frozenset(v for v in ann.half_up if v in values),
                            "signs": {v: m for v, m in ann.signs.items() if v in values}}
    if ann.quantizers:
        meta["quantizers"] = tuple(ann.quantizers)
    meta["notes"] = tuple(meta.get("notes", ())) + (
        f"Quantization parameters imported from "
        f"{'a QONNX' if ann.source == 'qonnx' else 'an onnxruntime ' + ann.source.upper()} model: "
        f"{len(activations)} tensor(s), {len(weights)} weight(s), {len(bias)} bias(es)",
        *notes)
    return Graph(nodes, graph.inputs, graph.outputs, graph.types, graph.constants, meta)


def _transposed(record: "IntegerConstant | None", group: int) -> "IntegerConstant | None":
    """A ConvTranspose weight's record in the convolution layout of the float graph's
    constant (per tensor, or per output channel: ONNX axis 1 with one group)."""
    if record is None or record.axis not in (None, 1) or (record.axis == 1 and group != 1):
        return None
    return IntegerConstant(conv_layout(record.q, group), record.zero_point, record.scale,
                           None if record.axis is None else 0,
                           conv_layout(record.value, group), record.bits)


def _rows_moved(record: "IntegerConstant | None", order) -> "IntegerConstant | None":
    """A Dense weight's record with row ``j`` moved to row ``order[j]`` (per tensor, or per
    output channel: axis 1)."""
    if record is None or record.axis not in (None, 1) or record.q.ndim != 2 or \
            len(order) != record.q.shape[0]:
        return None
    q, value = np.empty_like(record.q), np.empty_like(record.value)
    q[np.asarray(order)], value[np.asarray(order)] = record.q, record.value
    return IntegerConstant(q, record.zero_point, record.scale, record.axis, value, record.bits)


def _weight_annotation(graph: Graph, node, ann: Annotations) -> "dict | None":
    name = node.inputs[1]
    record = ann.integers.get(name)
    if node.op == "ConvTranspose":
        record = _transposed(ann.integers.get(node.attrs.get("source_weight")),
                             node.attrs["group"])
    elif node.attrs.get("row_order") is not None:          # rows moved by fold-transpose
        record = _rows_moved(ann.integers.get(node.attrs["source_weight"]),
                             node.attrs["row_order"])
    if record is None or record.bits != 8 or \
            not np.array_equal(graph.constants.get(name), record.value):
        return None
    channels = record.channels(1 if node.op == "Dense" else 0)
    if channels is None:
        return None
    return {"q": record.q, "scale": channels[0], "zero_point": channels[1]}


def _bias_annotation(graph: Graph, node, ann: Annotations, activations: dict,
                     weight: dict) -> "np.ndarray | None":
    if len(node.inputs) < 3 or node.inputs[0] not in activations:
        return None
    record = ann.integers.get(node.inputs[2])
    if record is None or record.bits != 32 or np.any(record.zero_point != 0) or \
            not np.array_equal(graph.constants.get(node.inputs[2]), record.value.reshape(-1)):
        return None
    scale = record.channels(0)[0] if record.q.ndim == 1 else None
    expected = np.float32(activations[node.inputs[0]][0]) * weight["scale"].astype(np.float32)
    if scale is None or not np.allclose(scale, expected, rtol=1e-6, atol=0):
        return None
    return record.q.reshape(-1).astype(np.int32)
