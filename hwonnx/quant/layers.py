"""The quantizers of the array layers: :data:`QUANTIZERS`, one function per float layer op
(registered with :func:`quantizer`), each making the integer node of a layer whose input and
output parameters :func:`~hwonnx.quant.ptq.quantize_graph` has chosen: the weighted layers
(``Conv``, ``Dense``, ``ConvTranspose``: int8 weights per output channel, int32 bias, the
requantization multipliers), the pools, ``Concat``, the residual ``Add``, the element-wise
engine's layers and the copies."""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import QuantizationError
from ..golden.ops import quantize
from ..ir import Graph, Node, TensorType
from ..ir.ops import IR_OPS
from .channels import check_accumulator, fit_channels
from .copies import concat_multipliers, quantize_copy
from .eltwise import quantize_eltwise
from .params import add_constants, clamp_bounds, requant_params
from .residual import quantize_residual_add

__all__ = ["QUANTIZERS", "LayerQuantization", "quantizer"]

#: Layers with convolution weights ``[M, C / group, KH, KW]``.
_CONV_LIKE = ("Conv", "ConvTranspose")


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
