"""Post-training quantization: float graph + calibration batch -> integer graph. The
parameters of every value are chosen here (given by a pre-quantized model, or calibrated);
each layer is then made by its quantizer (:mod:`.layers`), a table activation by
:mod:`.tables`."""

import logging

import numpy as np

from ..errors import QuantizationError, UnsupportedOperatorError
from ..golden.ops import HOST_OPS
from ..ir import Graph, Node, TensorType
from ..ir.ops import LAYER, LAYOUT, ir_ops, keeps_input_params
from ..ir.evaluate import TABLE_FUNCTIONS, evaluate_float, first_not_finite
from .check import check_layers
from .calibrate import DEFAULT_METHOD, Ranges, describe_method
from .data import calibration_feeds
from .layers import QUANTIZERS, LayerQuantization
from .params import activation_params
from .ranges import apply_ranges
from .tables import quantize_table

__all__ = ["quantize_graph", "CALIBRATION_METHOD"]

log = logging.getLogger(__name__)

CALIBRATION_METHOD = describe_method(DEFAULT_METHOD)
_LAYOUT_OPS = tuple(sorted(ir_ops(LAYOUT)))
_HOST = tuple(sorted(HOST_OPS))
_TABLES = tuple(sorted(TABLE_FUNCTIONS))
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
            quantize_table(node, graph, params, qname, nodes, constants, types)
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


def _concat_params(node: Node, params, ranges: Ranges) -> "tuple[float, int]":
    """Output scale and zero point of a channel ``Concat``: the inputs' own when they all
    share one scale and zero point (the requantization is then the identity and the output
    exactly its inputs' integers), else the calibrated range of the output (by min/max:
    the union of the inputs' ranges), within a fused ReLU / Clip."""
    shared = {params[x] for x in node.inputs}
    if len(shared) == 1:
        return next(iter(shared))
    return _output_params(node, ranges(node.outputs[0]))
