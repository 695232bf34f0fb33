"""Post-training quantization: float graph + calibration batch -> integer graph."""

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import QuantizationError, UnsupportedOperatorError
from ..golden.ops import HOST_OPS, quantize
from ..ir import Graph, Node, TensorType
from ..ir.ops import IR_OPS, LAYER, LAYOUT, integer_ops, ir_ops, keeps_input_params
from ..ir.evaluate import TABLE_FUNCTIONS, evaluate_float, first_not_finite
from .channels import check_accumulator, fit_channels
from .check import check_layers
from .calibrate import DEFAULT_METHOD, Ranges, describe_method
from .data import calibration_feeds
from .copies import concat_multipliers, quantize_copy
from .eltwise import quantize_eltwise
from .params import activation_params, add_constants, clamp_bounds, requant_params
from .ranges import apply_ranges
from .residual import quantize_residual_add

__all__ = ["quantize_graph", "activation_table", "CALIBRATION_METHOD", "QUANTIZERS",
           "LayerQuantization", "quantizer"]

log = logging.getLogger(__name__)

CALIBRATION_METHOD = describe_method(DEFAULT_METHOD)
_LAYOUT_OPS = tuple(sorted(ir_ops(LAYOUT)))
_HOST = tuple(sorted(HOST_OPS))
_TABLES = tuple(sorted(TABLE_FUNCTIONS))
#: Integer ops whose post-processing can apply an activation table.
_TABLE_HOSTS = integer_ops(LAYER)
#: Layers with convolution weights ``[M, C / group, KH, KW]``.
_CONV_LIKE = ("Conv", "ConvTranspose")
_LAYERS = tuple(sorted(ir_ops(LAYER)))


_CALIB_REQUIRED = ("pass --calib samples.npz (one array per input, first axis = samples) or "
                   "an .npy for a single-input model")


def quantize_graph(graph: Graph, calib: "dict[str, np.ndarray] | None",
                   method: str = DEFAULT_METHOD) -> Graph:
    """Quantize a float graph (``Conv``, ``Dense``, ``Add``, ``AvgPool``, ``MaxPool``,
    ``Concat``, the table activations of :data:`hwonnx.ir.tables.TABLE_OPS` (``LeakyRelu``,
    ``Sigmoid``, ``Elu``, ``Gelu``, ...), ``Flatten``, ``Reshape``, host ``Softmax``) to the
    integer vocabulary.

    Quantization parameters a pre-quantized model gives (``graph.meta["quantization"]``, see
    :func:`hwonnx.frontend.prequant.annotate_graph`) are used as they are: activation scales
    and zero points, int8 weights with their per-channel scales (a weight zero point is
    folded into the weights), int32 biases. Everything else comes from calibration on
    ``calib`` (``name -> [S, *shape]``) by ``method`` (:data:`~.calibrate.METHODS`: the
    activation ranges): int8 weights symmetric per output channel, int8 activations
    asymmetric per tensor, int32 bias. ``calib`` may be None when the model
    gives the parameters of every value that needs them.

    Raises
    ------
    QuantizationError
        If calibration data is needed but missing or not finite, a layout op would have to
        requantize, a weight zero point cannot be folded, or a layer could overflow int32.
    """
    leftover = [n for n in graph.nodes
                if n.op not in _LAYERS + _LAYOUT_OPS + _HOST + _TABLES]
    if leftover:
        raise UnsupportedOperatorError(
            [(n.name, f"{n.op} (not fused into a Conv/Gemm/MatMul)", "", graph.meta.get(
                "opset", 0)) for n in leftover])
    ann = graph.meta.get("quantization") or {}
    given = {v: (float(s), int(z)) for v, (s, z) in ann.get("activations", {}).items()}
    missing = [v for v in _quantized_values(graph, given) if v not in given]
    values: "dict[str, np.ndarray]" = {}
    ranges = Ranges(values, method)
    feeds: "dict[str, np.ndarray]" = {}
    if missing and calib is None:
        if not ann:
            raise QuantizationError(f"Calibration data is required to quantize a float model: "
                                    f"{_CALIB_REQUIRED}")
        listed = ", ".join(f"'{v}'" for v in missing[:5]) + (", ..." if len(missing) > 5
                                                              else "")
        raise QuantizationError(f"Calibration data is required: the model gives no "
                                f"quantization parameters for {len(missing)} value(s) "
                                f"({listed}); {_CALIB_REQUIRED}")
    if missing:
        feeds = calibration_feeds(graph, calib)
        values.update(evaluate_float(graph, feeds, keep_all=True))
        _check_finite(graph, values)
    params: "dict[str, tuple[float, int]]" = {}
    for name in graph.inputs:
        if name not in given and np.ptp(values[name]) == 0:
            raise QuantizationError(
                f"Calibration data for input '{name}' is constant ({float(values[name].flat[0]):g}"
                f" in every sample and position): it gives the input no range to quantize; "
                f"pass representative samples")
        params[name] = given.get(name) or activation_params(*ranges(name), f"input '{name}'")

    nodes, types, constants = [], {}, {}
    qname = {}
    for name in graph.inputs:
        qname[name] = f"{name}:q"
        scale, zp = params[name]
        types[name] = graph.types[name]
        types[qname[name]] = TensorType("int8", graph.types[name].shape)
        nodes.append(Node(f"quantize_{name}", "Quantize", (name,), (qname[name],),
                          {"scale": scale, "zero_point": zp}))

    host_values: "set[str]" = set()
    dequantized: "dict[str, str]" = {}
    warnings: "list[str]" = list(graph.meta.get("warnings", ()))

    def float_value(value: str) -> str:
        """The float version of an accelerator value, dequantized once on the host."""
        if value in host_values or value in graph.inputs:
            return value
        if value not in dequantized:
            scale, zp = params[value]
            name = value if value in graph.outputs else f"{value}:dq"
            types[name] = TensorType("float32", graph.types[value].shape)
            nodes.append(Node(f"dequantize_{value}", "Dequantize", (qname[value],), (name,),
                              {"scale": scale, "zero_point": zp}))
            dequantized[value] = name
        return dequantized[value]

    layer_ann = (ann.get("weights", {}), ann.get("bias", {}), given)
    for node in graph.nodes:
        x = node.inputs[0]
        out = node.outputs[0]
        if node.op in _HOST or x in host_values:       # host steps after the accelerator
            if node.op not in _HOST + _LAYOUT_OPS:
                raise UnsupportedOperatorError([(node.name, f"{node.op} after a host step",
                                                 "", graph.meta.get("opset", 0))])
            types[out] = TensorType("float32", graph.types[out].shape)
            nodes.append(Node(node.name, node.op, (float_value(x),), (out,), node.attrs))
            host_values.add(out)
            continue
        qname[out] = f"{out}:q"
        types[qname[out]] = TensorType("int8", graph.types[out].shape)
        if node.op in _LAYOUT_OPS:
            params[out] = params[x]
            if given.get(out, params[x]) != params[x]:
                raise QuantizationError(
                    f"{node.op} '{node.name}': its output '{out}' is quantized with scale "
                    f"{given[out][0]:.6g} and zero point {given[out][1]}, its input '{x}' with "
                    f"scale {params[x][0]:.6g} and zero point {params[x][1]}; a layout op "
                    f"cannot requantize")
            nodes.append(Node(node.name, node.op, (qname[x],), (qname[out],), node.attrs))
            continue
        if node.op in _TABLES:
            params[out] = given.get(out) or activation_params(
                *ranges(out), f"'{out}' (output of '{node.name}')")
            _quantize_table(node, graph, params, qname, nodes, constants, types)
            continue
        if keeps_input_params(node):
            params[out] = given.get(out) or params[x]
        elif out not in given and node.op != "Concat" and _empty_range(node, values[out]):
            params[out] = _borrowed_params(node, graph, params, values, ranges, warnings)
        else:
            params[out] = given.get(out) or (
                _concat_params(node, params, ranges) if node.op == "Concat"
                else _output_params(node, ranges(out)))
        nodes.append(QUANTIZERS[node.op](node, LayerQuantization(
            graph, params, qname, constants, types, given, layer_ann, warnings)))

    outputs = [name if name in host_values else float_value(name) for name in graph.outputs]
    nodes = apply_ranges(nodes, ann.get("ranges", {}), qname,     # n-bit and narrow ranges
                         ann.get("half_up", frozenset()), ann.get("signs", {}))
    meta = {k: v for k, v in graph.meta.items() if k != "quantization"}
    meta.update(_describe(ann, graph, missing, calib, method), warnings=tuple(warnings))
    result = Graph(nodes, graph.inputs, tuple(outputs), types, constants, meta)
    if values:
        result = check_layers(result, values, feeds, params)
    return result


@dataclass(frozen=True)
class LayerQuantization:
    """What a quantizer (:data:`QUANTIZERS`) reads, and the integer graph's ``constants`` and
    ``types`` it adds to: the float ``graph``, each value's ``params`` (scale, zero point:
    the layer's output's already chosen), the integer names ``qname``, the parameters the
    model gives (``given``; ``layer_ann``: its weights, biases and activations), and the
    build's ``warnings``."""
    graph: Graph
    params: "dict[str, tuple[float, int]]"
    qname: "dict[str, str]"
    constants: dict
    types: dict
    given: "dict[str, tuple[float, int]]"
    layer_ann: tuple
    warnings: "list[str]"


#: Float array layer op -> its quantizer ``fn(node, LayerQuantization) -> integer Node``,
#: registered with :func:`quantizer` (``tests/ir/test_registry.py``: one per layer op of the
#: operator registry, :mod:`hwonnx.ir.ops`).
QUANTIZERS: "dict[str, Callable[[Node, LayerQuantization], Node]]" = {}


def quantizer(*ops: str):
    """Register the decorated function as the quantizer of the float layer ops ``ops``."""
    def register(fn):
        for op in ops:
            QUANTIZERS[op] = fn
        return fn
    return register


@quantizer("Conv", "Dense", "ConvTranspose")
def _quantize_weighted(node: Node, q: LayerQuantization) -> Node:
    return _quantize_layer(node, q.graph, q.params[node.inputs[0]], q.params[node.outputs[0]],
                           q.qname, q.constants, q.types, q.layer_ann, q.warnings)


@quantizer("Add")
def _quantize_add(node: Node, q: LayerQuantization) -> Node:
    exact = all(v in q.given for v in (*node.inputs[:2], node.outputs[0]))
    return quantize_residual_add(node, q.params, q.qname, q.constants, q.types, exact)


@quantizer("Eltwise")
def _quantize_eltwise(node: Node, q: LayerQuantization) -> Node:
    return quantize_eltwise(node, q.params, q.qname, q.constants, q.types)


@quantizer("AvgPool")
def _quantize_avg(node: Node, q: LayerQuantization) -> Node:
    exact = node.inputs[0] in q.given and node.outputs[0] in q.given
    return _quantize_avgpool(node, q.params, q.qname, q.constants, q.types, exact)


@quantizer("MaxPool")
def _quantize_max(node: Node, q: LayerQuantization) -> Node:
    return _quantize_maxpool(node, q.params, q.qname, q.constants, q.types)


@quantizer("Concat")
def _quantize_cat(node: Node, q: LayerQuantization) -> Node:
    return _quantize_concat(node, q.params, q.qname, q.constants, q.types)


@quantizer("Slice", "Permute", "ChannelPermute")
def _quantize_copies(node: Node, q: LayerQuantization) -> Node:
    return quantize_copy(node, q.params, q.qname, q.constants, q.types)


def _check_finite(graph: Graph, values: "dict[str, np.ndarray]") -> None:
    """Refuse calibration on which a node overflows float32 (naming the first one)."""
    node = first_not_finite(graph, values)
    if node is not None:
        raise QuantizationError(f"Node '{node.name}' ({node.op}) computes inf or NaN on the "
                                f"calibration data: its result is beyond float32 (weights or "
                                f"values too large)")


def _quantized_values(graph: Graph, given=frozenset()) -> "list[str]":
    """The values whose quantization parameters must be chosen: graph inputs and the outputs
    of accelerator nodes other than layout ops (which keep their input's parameters) and
    than copies (``MaxPool``, ``Slice``, ``Permute``, ``ChannelPermute``, a ``copy``
    layer) of a value whose parameters ``given`` has or copies."""
    host: "set[str]" = set()
    known = set(given)
    needed = list(graph.inputs)
    for node in graph.nodes:
        if node.op in _HOST or node.inputs[0] in host:
            host.update(node.outputs)
        elif node.op in _LAYOUT_OPS or (node.inputs[0] in known and keeps_input_params(node)):
            if node.inputs[0] in known:
                known.add(node.outputs[0])
        else:
            needed.append(node.outputs[0])
    return needed


def _describe(ann: dict, graph: Graph, missing: "list[str]", calib, method: str) -> dict:
    """The quantization entries of the integer graph's metadata (and the build report)."""
    samples = int(next(iter(calib.values())).shape[0]) if calib and missing else 0
    if not ann:
        return {"calibration": describe_method(method), "calibration_samples": samples,
                "activation_quantization": "int8 asymmetric per tensor",
                "weight_quantization": "int8 symmetric per output channel"}
    source = f"from the {ann.get('source', 'pre-quantized').upper()} model"
    layers = sum(n.op in ("Conv", "Dense") for n in graph.nodes)
    given = len(ann.get("weights", {}))
    calibration = source + (f"; {describe_method(method)} for {len(missing)} value(s)"
                            if missing else "")
    weights = f"int8 per output channel, {source}" if given == layers else (
        f"int8 per output channel: {given} of {layers} layer(s) {source}, the others "
        f"symmetric from float")
    return {"calibration": calibration, "calibration_samples": samples,
            "activation_quantization": f"int8 per tensor, {source}", "weight_quantization":
            weights}


def _layer_weights(node: Node, w: np.ndarray, channels: int, record: "dict | None"
                   ) -> "tuple[np.ndarray, np.ndarray]":
    """Per-channel weight scale and int8 weights ``[channels, K]``: the model's integers
    minus their zero point (``record``), else symmetric from the float weights."""
    w_by_channel = w.reshape(channels, -1) if node.op in _CONV_LIKE else w.T
    if node.attrs.get("copy"):         # an upsampling: weights of one, exactly
        return np.ones(channels), w_by_channel.astype(np.int8)
    if record is None:
        s_w = np.abs(w_by_channel).max(axis=1) / 127.0
        s_w[s_w == 0] = 1.0
        return s_w, np.clip(np.rint(w_by_channel / s_w[:, None]), -127, 127).astype(np.int8)
    q = np.asarray(record["q"]).astype(np.int64)
    q = q.reshape(channels, -1) if node.op in _CONV_LIKE else q.T
    zero_point = np.broadcast_to(np.asarray(record["zero_point"], np.int64).reshape(-1),
                                 (channels,))
    wq = q - zero_point[:, None]
    bad = np.flatnonzero((wq < -128).any(axis=1) | (wq > 127).any(axis=1))
    if bad.size:
        ch = int(bad[0])
        worst = int(wq[ch][np.argmax(np.abs(wq[ch]))])
        raise QuantizationError(f"Layer '{node.name}': the weight zero point of output "
                                f"channel {ch} takes q - zero_point to {worst}, outside int8 "
                                f"[-128, 127]; the array multiplies int8 weights without a "
                                f"zero point")
    s_w = np.broadcast_to(np.asarray(record["scale"], np.float64).reshape(-1), (channels,))
    return s_w.copy(), wq.astype(np.int8)


def _quantize_layer(node: Node, graph: Graph, in_params, out_params, qname, constants,
                    types, layer_ann=({}, {}, {}), warnings: "list[str] | None" = None
                    ) -> Node:
    (s_in, zp_in), (s_out, zp_out) = in_params, out_params
    weights, biases, given = layer_ann
    warnings = [] if warnings is None else warnings
    w = graph.constants[node.inputs[1]].astype(np.float64)
    channels = w.shape[0] if node.op in _CONV_LIKE else w.shape[1]
    has_bias = len(node.inputs) > 2 and node.inputs[2]
    bias = (graph.constants[node.inputs[2]].astype(np.float64).reshape(-1)
            if has_bias else np.zeros(channels))
    record = weights.get(node.inputs[1])
    s_w, wq = _layer_weights(node, w, channels, record)
    if has_bias and record is not None and node.inputs[2] in biases \
            and node.inputs[0] in given:
        bq = np.asarray(biases[node.inputs[2]], np.int64).reshape(-1).astype(np.float64)
    else:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            bq = np.rint(bias / (s_in * s_w))       # (a channel beyond int32 is fitted below)
    model_params = record is not None and node.inputs[0] in given and node.outputs[0] in given
    if model_params:
        # the model's own parameters: the multiplier onnxruntime uses, (s_in * s_w) / s_out
        # in float32, which the 31-bit mult represents exactly
        with np.errstate(over="ignore", under="ignore"):    # requant_params refuses inf
            real = (np.float32(s_in) * s_w.astype(np.float32) / np.float32(s_out)).astype(
                np.float64)
        exact = s_in * s_w / s_out           # a channel whose multiplier underflows float32
        real = np.where((real == 0) & (exact != 0), exact, real)  # is fitted below
        if not real.all():
            raise QuantizationError(f"Layer '{node.name}': the requantization scale (input "
                                    f"scale x weight scale / output scale) underflows float32")
    else:
        real = s_in * s_w / s_out
    w_by_channel = w.reshape(channels, -1) if node.op in _CONV_LIKE else w.T
    fit_channels(node.name, w_by_channel, bias, wq, bq, real, s_in, s_out, zp_in,
                 record is not None, warnings)
    check_accumulator(node.name, wq, bq, zp_in, record is not None)
    mult, shift = requant_params(real, node.name)
    lo, hi = clamp_bounds(node, out_params)
    prefix = node.name
    names = {k: f"{prefix}:{k}" for k in ("w", "bias", "mult", "shift")}
    if node.op in _CONV_LIKE:
        constants[names["w"]] = wq.reshape(w.shape)
    else:
        constants[names["w"]] = np.ascontiguousarray(wq.T)
    constants[names["bias"]] = bq.astype(np.int32)
    constants[names["mult"]] = mult
    constants[names["shift"]] = shift
    for key, array in ((k, constants[names[k]]) for k in names):
        types[names[key]] = TensorType(str(array.dtype), array.shape)
    attrs = {"in_zp": zp_in, "out_zp": zp_out, "lo": lo, "hi": hi,
             "in_scale": s_in, "out_scale": s_out, "relu": bool(node.attrs.get("relu")),
             **_padding(node, s_in, zp_in)}
    if model_params:          # onnxruntime's rounding, where the architecture has it (api)
        attrs["rounding"] = "ort"
    if node.op == "Conv":
        attrs.update(strides=tuple(node.attrs["strides"]), pads=tuple(node.attrs["pads"]),
                     dilations=tuple(node.attrs["dilations"]),
                     group=int(node.attrs.get("group", 1)))
    elif node.op == "ConvTranspose":
        attrs.update(strides=tuple(node.attrs["strides"]), pads=tuple(node.attrs["pads"]),
                     out_hw=tuple(node.attrs["out_hw"]), group=int(node.attrs["group"]))
    return Node(node.name, IR_OPS[node.op].quantized,
                (qname[node.inputs[0]], names["w"], names["bias"], names["mult"],
                 names["shift"]), (qname[node.outputs[0]],), attrs)


def _padding(node: Node, s_in: float, zp_in: int) -> dict:
    """``pad_q``, the int8 value of a folded constant ``Pad`` of another value than the
    layer's own padding, quantized with the input's parameters (saturating)."""
    if "pad_value" not in node.attrs:
        return {}
    value = np.float32(node.attrs["pad_value"])
    return {"pad_q": int(quantize(value, scale=s_in, zero_point=zp_in))}


def _output_params(node: Node, calibrated: "tuple[float, float]") -> "tuple[float, int]":
    """Output scale and zero point from the ``calibrated`` range, within a fused ReLU / Clip
    range."""
    lo, hi = _range(node, calibrated)
    return activation_params(lo, hi, f"'{node.outputs[0]}' (output of '{node.name}')")


def _range(node: Node, calibrated: "tuple[float, float]") -> "tuple[float, float]":
    """The ``calibrated`` range of a layer's output, within a fused ReLU / Clip range."""
    lo, hi = calibrated
    if node.attrs.get("relu"):
        lo = max(lo, 0.0)
    if node.attrs.get("act_max") is not None:
        hi = min(hi, float(node.attrs["act_max"]))
    return lo, hi


def _empty_range(node: Node, values: np.ndarray) -> bool:
    """Whether the output's calibrated range, with real 0 included, is empty: the layer
    wrote one constant (0 after a dead ReLU) on every calibration sample."""
    lo, hi = _range(node, (float(values.min()), float(values.max())))
    return max(hi, 0.0) - min(lo, 0.0) < 1e-12


def _borrowed_params(node: Node, graph: Graph, params, values, ranges: Ranges,
                     warnings: "list[str]") -> "tuple[float, int]":
    """Parameters for a layer output that is constant on the calibration data (a dead ReLU
    branch): any scale represents it, but the scale matters where the value meets another
    (a residual ``Add`` weights its inputs in the ratio of their scales, so a fallback scale
    of 1 would round the live input away). The scale is taken from the first consumer
    ``Add``/``Concat``'s output when its range is not empty, else from the layer's input;
    real 0 stays exact. The choice is a warning naming the value."""
    out = node.outputs[0]
    source, scale = None, None
    for consumer in graph.consumers(out):
        if consumer.op in ("Add", "Concat") and not _empty_range(consumer,
                                                                 values[consumer.outputs[0]]):
            lo, hi = _range(consumer, ranges(consumer.outputs[0]))
            scale = activation_params(lo, hi, f"'{consumer.outputs[0]}'")[0]
            source = f"'{consumer.outputs[0]}', the output of {consumer.op} '{consumer.name}'"
            break
    if scale is None:
        scale = params[node.inputs[0]][0]
        source = f"its input '{node.inputs[0]}'"
    constant = float(values[out].flat[0]) if values[out].size else 0.0
    text = (f"'{out}' (output of '{node.name}') is constant {constant:g} on every calibration "
            f"sample (a dead branch?); it takes the scale {scale:.4g} of {source}")
    log.warning("%s", text)
    warnings.append(text)
    return scale, -128 if node.attrs.get("relu") else 0


def _quantize_avgpool(node: Node, params, qname, constants, types, exact=False) -> Node:
    """A pool of ``exact`` parameters (the model's own, both sides) rounds as the QDQ float
    semantics do, half to even (``rounding="ort"``, where the architecture has the unit): a
    2x2 pool with equal scales lands on an exact tie in a quarter of its values."""
    x = node.inputs[0]
    (s_in, zp_in), (s_out, zp_out) = params[x], params[node.outputs[0]]
    kernel = tuple(node.attrs["kernel"])
    channels = types[qname[x]].shape[1]
    window = kernel[0] * kernel[1]
    # count_include_pad=0 with padding: one multiplier per number of real pixels (row k - 1)
    exclude = bool(any(node.attrs["pads"]) and not node.attrs.get("count_include_pad"))
    counts = np.arange(1, window + 1) if exclude else np.array([window])
    real = np.repeat(s_in / (counts * s_out), channels)
    mult, shift = requant_params(real, node.name)
    if exclude:
        mult, shift = mult.reshape(window, channels), shift.reshape(window, channels)
    names = add_constants(node.name, {"mult": mult, "shift": shift}, constants, types)
    lo, hi = clamp_bounds(node, params[node.outputs[0]])
    return Node(node.name, "QAvgPool", (qname[x],) + names, (qname[node.outputs[0]],),
                {"in_zp": zp_in, "out_zp": zp_out, "lo": lo, "hi": hi, "kernel": kernel,
                 "strides": tuple(node.attrs["strides"]), "pads": tuple(node.attrs["pads"]),
                 "count_include_pad": not exclude, "in_scale": s_in, "out_scale": s_out,
                 "relu": bool(node.attrs.get("relu")), **_padding(node, s_in, zp_in),
                 **({"rounding": "ort"} if exact else {})})


def _quantize_maxpool(node: Node, params, qname, constants, types) -> Node:
    """Max pooling commutes with the (monotone) requantization: the int8 maximum is
    requantized by ``s_in / s_out``, the identity when the output keeps the input's
    parameters (the default), so the output is then exactly the input's integers."""
    x = node.inputs[0]
    (s_in, zp_in), (s_out, zp_out) = params[x], params[node.outputs[0]]
    channels = types[qname[x]].shape[1]
    if (s_in, zp_in) == (s_out, zp_out):
        mult, shift = np.full(channels, 1 << 30, np.int32), np.full(channels, 30, np.int32)
    else:
        mult, shift = requant_params(np.full(channels, s_in / s_out), node.name)
    names = add_constants(node.name, {"mult": mult, "shift": shift}, constants, types)
    lo, hi = clamp_bounds(node, params[node.outputs[0]])
    return Node(node.name, "QMaxPool", (qname[x],) + names, (qname[node.outputs[0]],),
                {"in_zp": zp_in, "out_zp": zp_out, "lo": lo, "hi": hi,
                 "kernel": tuple(node.attrs["kernel"]), "strides": tuple(node.attrs["strides"]),
                 "pads": tuple(node.attrs["pads"]), "dilations": tuple(node.attrs["dilations"]),
                 "in_scale": s_in, "out_scale": s_out, "relu": bool(node.attrs.get("relu")),
                 **_padding(node, s_in, zp_in)})


def activation_table(op: str, attrs, in_params, out_params) -> "tuple[int, ...]":
    """The 256 int8 outputs of the elementwise function ``op`` for the int8 inputs -128 ...
    127: dequantized, the function and the quantization in float32, rounding half to even
    (as onnxruntime's DequantizeLinear -> op -> QuantizeLinear computes them). Outside the
    function's domain an infinity saturates and NaN gives -128, as onnxruntime's
    QuantizeLinear does."""
    (s_in, zp_in), (s_out, zp_out) = in_params, out_params
    x = (np.arange(-128, 128) - zp_in).astype(np.float32) * np.float32(s_in)
    with np.errstate(all="ignore"):       # outside the domain: NaN or infinities, saturated
        y = np.asarray(TABLE_FUNCTIONS[op](x, attrs), np.float32)
        q = np.clip(np.rint(y / np.float32(s_out)) + zp_out, -128, 127)
    q[np.isnan(q)] = -128
    return tuple(int(v) for v in q)


def _quantize_table(node: Node, graph: Graph, params, qname, nodes, constants, types) -> None:
    """An elementwise activation: a lookup table applied by the post-processor of the layer
    that writes its input, when nothing else reads that value (the layer's output, quantized
    with the input's parameters, becomes the table's index), else by an identity copy (a
    one-source ``QConcat``)."""
    x, out = node.inputs[0], node.outputs[0]
    table = activation_table(node.op, node.attrs, params[x], params[out])
    attrs = {"table": table, "activation": node.op}
    last = nodes[-1] if nodes else None
    readers = graph.consumers(x)
    if last is not None and last.outputs == (qname[x],) and last.op in _TABLE_HOSTS \
            and last.attrs.get("table") is None and x not in graph.outputs \
            and len(readers) == 1 and readers[0] is node:
        del types[qname[x]]
        nodes[-1] = Node(last.name, last.op, last.inputs, (qname[out],),
                         {**last.attrs, **attrs, "table_node": node.name})
        return
    s_in, zp_in = params[x]
    shape = types[qname[x]].shape
    if len(shape) < 2:
        raise UnsupportedOperatorError([(node.name, f"{node.op} on '{x}' of shape {list(shape)} "
                                         f"(the array takes [1, C, H, W] images or [1, K] "
                                         f"vectors)", "", graph.meta.get("opset", 0))])
    channels = shape[1]
    names = add_constants(node.name, {"mult": np.full(channels, 1 << 30, np.int32),
                                      "shift": np.full(channels, 30, np.int32)},
                           constants, types)
    nodes.append(Node(node.name, "QConcat", (qname[x],) + names, (qname[out],),
                      {"zps": (zp_in,), "out_zp": zp_in, "lo": -128, "hi": 127,
                       "scales": (s_in,), "out_scale": s_in, **attrs}))


def _concat_params(node: Node, params, ranges: Ranges) -> "tuple[float, int]":
    """Output scale and zero point of a channel ``Concat``: the inputs' own when they all
    share one scale and zero point (the requantization is then the identity and the output
    exactly its inputs' integers), else the calibrated range of the output (by min/max:
    the union of the inputs' ranges), within a fused ReLU / Clip."""
    shared = {params[x] for x in node.inputs}
    if len(shared) == 1:
        return next(iter(shared))
    return _output_params(node, ranges(node.outputs[0]))


def _quantize_concat(node: Node, params, qname, constants, types) -> Node:
    """``Concat``: output channel ``c`` (along the channel axis), or every value of source
    ``j`` (along height or width), is ``x_j - zp_j`` requantized with its own multiplier ``s_j
    / s_out`` (weight 1: the precision of the 31-bit multiplier, exactly the identity when
    ``s_j = s_out``)."""
    s_out, zp_out = params[node.outputs[0]]
    mult, shift = concat_multipliers(node, params, [types[qname[x]].shape[1]
                                                    for x in node.inputs], s_out)
    names = add_constants(node.name, {"mult": mult, "shift": shift}, constants, types)
    lo, hi = clamp_bounds(node, params[node.outputs[0]])
    return Node(node.name, "QConcat", tuple(qname[x] for x in node.inputs) + names,
                (qname[node.outputs[0]],),
                {"zps": tuple(params[x][1] for x in node.inputs), "out_zp": zp_out, "lo": lo,
                 "hi": hi, "scales": tuple(params[x][0] for x in node.inputs),
                 "out_scale": s_out, "relu": bool(node.attrs.get("relu")),
                 "axis": int(node.attrs["axis"])})
