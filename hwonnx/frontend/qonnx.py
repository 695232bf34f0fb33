"""Import of QONNX models (Brevitas and QKeras exports, FINN's and hls4ml's input format).

:func:`rewrite_qonnx` rewrites, in place and before :mod:`.prequant`, the QONNX custom
operators into the QDQ form that :mod:`.prequant` already imports, so there is one
quantization path:

- ``Quant``/``IntQuant`` of a run-time tensor (an activation quantizer) becomes
  ``QuantizeLinear`` (int8, or uint8 for an unsigned 8-bit range) -> ``Clip`` to the
  quantizer's integer range (signed/unsigned, ``narrow``, 1 to 8 bits) -> ``DequantizeLinear``:
  the QCDQ form, which :mod:`.prequant` records as the tensor's scale, zero point and clamp
  range. Only ``rounding_mode`` ``ROUND``/``HALF_EVEN`` is QuantizeLinear's rounding.
- ``Quant``/``IntQuant``/``BipolarQuant`` of a constant (weights, biases) is evaluated here,
  exactly as qonnx's reference implementation does (float32, the node's own rounding mode),
  and becomes ``DequantizeLinear`` of the integers (int8 up to 8 bits, int32 above): the
  float constant is bit for bit the value qonnx computes, and the integers are recorded.
- ``Trunc`` becomes a depthwise sum requantized by exactly ``2^-k`` (:meth:`trunc`); a
  graph input annotated as a small integer type is quantized with scale 1.
- The run-time tensors' quantizers (activations, inputs, ``Trunc``) are rewritten in
  :mod:`.qonnx_activations`; the layer-level rewrites are in :mod:`.qonnx_layers`:
  channels-last operators as their NCHW twins, a ``BatchNormalization`` between a layer and
  its quantizer folded into the layer, bipolar activations as the layer's sign, low-bit
  weights widened for a float bias.

Semantics are those of the qonnx package's reference executor (``qonnx.custom_op.general``:
``int_quant``, ``binary_quant``, ``trunc_v1``/``trunc_v2``); ``docs/qonnx.md`` describes the
mapping and where it is exact.
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError
from .common import ReadLog, fresh_name, is_default_domain
from .qonnx_activations import QonnxActivationRewrites
from .qonnx_layers import (CHANNELS_LAST_DOMAIN, KNOWN_DOMAINS, QONNX_DOMAINS,
                           QonnxLayerRewrites, attrs_of, bounds, cancel_transposes, label)

__all__ = ["QONNX_DOMAINS", "CHANNELS_LAST_DOMAIN", "KNOWN_DOMAINS", "import_missing_domains",
           "is_qonnx", "rewrite_qonnx"]

_QUANT_OPS = ("Quant", "IntQuant", "BipolarQuant", "Trunc")
#: qonnx's ``resolve_rounding_mode``: rounding_mode -> function of float32 arrays.
_ROUNDING = {
    "ROUND": np.round, "HALF_EVEN": np.round, "CEIL": np.ceil, "FLOOR": np.floor,
    "UP": lambda x: np.sign(x) * np.ceil(np.abs(x)), "DOWN": np.fix,
    "HALF_UP": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
    "HALF_DOWN": lambda x: np.sign(x) * np.ceil(np.abs(x) - 0.5),
}


def import_missing_domains(model: onnx.ModelProto, rlog: ReadLog) -> None:
    """Import, with a warning naming the missing ``opset_import`` entry, each known QONNX
    domain a node of the main graph uses without the model importing it (qonnx's own tools
    write such models); an unknown domain is left to the IR check, which refuses it."""
    imported = {o.domain for o in model.opset_import}
    for node in model.graph.node:
        if node.domain in KNOWN_DOMAINS and node.domain not in imported:
            imported.add(node.domain)
            model.opset_import.add(domain=node.domain, version=1)
            rlog.warn(f"Node '{node.name}' uses {node.op_type} of domain '{node.domain}', which "
                      f"the model's opset_import does not import: the file is not valid ONNX "
                      f"IR as it stands (add the opset_import entry '{node.domain}' version 1); "
                      f"hwonnx reads it as {node.domain} version 1")


def is_qonnx(model: onnx.ModelProto) -> bool:
    """Whether the main graph holds a node of a QONNX domain."""
    return any(node.domain in KNOWN_DOMAINS for node in model.graph.node)


class _QonnxRewriter(QonnxActivationRewrites, QonnxLayerRewrites):
    def __init__(self, model: onnx.ModelProto, rlog: ReadLog):
        self.model, self.graph, self.rlog = model, model.graph, rlog
        self.consts = {i.name: numpy_helper.to_array(i) for i in self.graph.initializer}
        for node in self.graph.node:             # Constant nodes (exporters write both)
            if node.op_type == "Constant" and is_default_domain(node.domain) and node.output \
                    and [a.name for a in node.attribute] == ["value"]:
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.taken = set(self.consts) | {v.name for v in (*self.graph.input,
                                                          *self.graph.output)} | \
            {v for n in self.graph.node for v in n.output}
        self.added: "dict[str, np.ndarray]" = {}
        self.quantizers: "list[dict]" = []
        self.half_up: "set[str]" = set()       # values requantized half up (Trunc FLOOR/CEIL)
        self.signs: "dict[str, tuple[str, str]]" = {}   # bipolar inputs: (mode, quantizer)
        self.opsets = {o.domain: o.version for o in model.opset_import}

    def fresh(self, base: str) -> str:
        return fresh_name(self.taken, base)

    def const(self, value: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        self.consts[name] = self.added[name] = value
        return name

    def constant_input(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray:
        name = node.input[index] if index < len(node.input) else ""
        if name not in self.consts:
            raise ModelError(f"{label(node)} needs a constant {what} (input {index}), but "
                             f"'{name}' is {'absent' if not name else 'computed at run time'}; "
                             f"hwonnx imports static quantizers only")
        return self.consts[name]

    def params(self, node: onnx.NodeProto) -> dict:
        """Scale, zero point, bit width and attributes of a Quant/IntQuant node, checked."""
        attrs = attrs_of(node)
        for name in ("signed", "narrow"):
            if name not in attrs:
                raise ModelError(f"{label(node)} has no attribute '{name}'; qonnx's reference "
                                 f"executor requires it (its documentation gives a default, "
                                 f"its code none): set it explicitly")
        rounding = attrs.get("rounding_mode", b"ROUND")
        rounding = (rounding.decode() if isinstance(rounding, bytes) else str(rounding)).upper()
        if rounding not in _ROUNDING:
            raise ModelError(f"{label(node)} has rounding_mode '{rounding}'; qonnx defines "
                             f"{', '.join(sorted(_ROUNDING))}")
        scale = self.constant_input(node, 1, "scale").astype(np.float32)
        zeropt = self.constant_input(node, 2, "zero point").astype(np.float32)
        bits = self.bit_width(node, 3, "bit width")
        self.check_scale(node, scale, "scale")
        if np.any(zeropt != np.round(zeropt)):
            raise ModelError(f"{label(node)} has a zero point that is not an integer "
                             f"({zeropt.reshape(-1)[:4].tolist()}); hwonnx's grids have "
                             f"integer zero points")
        return {"signed": bool(attrs["signed"]), "narrow": bool(attrs["narrow"]),
                "rounding": rounding, "scale": scale, "zeropt": zeropt,
                "bits": bits}

    def bit_width(self, node: onnx.NodeProto, index: int, what: str) -> int:
        """The constant bit width of input ``index``: one finite integer from 1 to 32."""
        bits = np.asarray(self.constant_input(node, index, what), np.float64).reshape(-1)
        if bits.size != 1 or not np.isfinite(bits[0]) or bits[0] != np.round(bits[0]) or \
                not 1 <= bits[0] <= 32:
            raise ModelError(f"{label(node)} has {what} {bits[:4].tolist()}; hwonnx reads one "
                             f"integer {what} from 1 to 32")
        return int(bits[0])

    def check_scale(self, node: onnx.NodeProto, scale: np.ndarray, what: str) -> None:
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise ModelError(f"{label(node)} has {what} {scale.reshape(-1)[:4].tolist()}; "
                             f"scales must be positive finite floats")

    def check_broadcast(self, node: onnx.NodeProto, w: np.ndarray,
                        **params: np.ndarray) -> None:
        """Check that each of ``params`` (a scale, a zero point) broadcasts to the constant
        ``w`` the quantizer reads, as qonnx requires (the output has the input's shape)."""
        for what, value in params.items():
            shape = tuple(np.shape(value))
            if len(shape) > w.ndim or any(d not in (1, n) for d, n in
                                          zip(shape[::-1], w.shape[::-1])):
                raise ModelError(f"{label(node)} has a {what} of shape {list(shape)}, which "
                                 f"does not broadcast to '{node.input[0]}' of shape "
                                 f"{list(w.shape)} (QONNX: the {what} broadcasts to the input)")

    def describe(self, node, bits: int, signed: bool, narrow: bool, scale,
                 rounding: str) -> None:
        """Record what the quantizer ``node`` is (for ``hwonnx inspect``): the layer it
        belongs to and its role there (``weights``/``bias``: the layer reads it; ``output``:
        the layer writes its input, through ``Relu``/``BatchNormalization``/``Transpose``;
        ``input``: it quantizes a graph input)."""
        flat = np.asarray(scale, np.float64).reshape(-1)
        log2 = np.log2(flat)
        kind = ("power-of-two" if np.all(log2 == np.round(log2)) else "arbitrary") + \
            (" per channel" if np.unique(flat).size > 1 else " per tensor")
        x = node.input[0]
        if x in self.consts:
            reader = next(((n, list(n.input).index(node.output[0])) for n in self.order
                           if node.output[0] in n.input), (None, 0))
            layer = reader[0].name if reader[0] is not None else node.name
            role = {1: "weights", 2: "bias"}.get(reader[1], "constant")
        else:
            producer = self.producers.get(x)
            while producer is not None and producer.op_type in (
                    "Relu", "BatchNormalization", "Transpose", "Identity") and producer.input:
                producer = self.producers.get(producer.input[0])
            layer = producer.name if producer is not None else x
            role = "output" if producer is not None else "input"
        self.quantizers.append({"node": node.name, "op": node.op_type, "layer": layer,
                                "role": role, "bits": bits, "signed": signed,
                                "narrow": narrow, "scale": kind, "rounding": rounding})

    def weight_constant(self, node: onnx.NodeProto) -> "tuple[np.ndarray, np.ndarray, int]":
        """The integers ``q - zeropt``, the scale (1-D) and its axis of a quantizer of a
        constant, computed as qonnx's reference does (float32 throughout)."""
        w = self.consts[node.input[0]].astype(np.float32)
        if node.op_type == "BipolarQuant":
            scale = self.constant_input(node, 1, "scale").astype(np.float32)
            self.check_broadcast(node, w, scale=scale)
            q = np.where(w >= 0.0, 1, -1)
            self.describe(node, 1, True, False, scale, "sign")
            return q, scale, self.axis_of(node, scale, w)
        p = self.params(node)
        scale, zeropt, bits = p["scale"], p["zeropt"], p["bits"]
        self.check_broadcast(node, w, scale=scale, **{"zero point": zeropt})
        with np.errstate(over="ignore", invalid="ignore"):
            y = w / scale + zeropt
        if bits == 1 and p["signed"]:          # qonnx: a 1-bit signed Quant is bipolar
            y = np.where(y >= 0.0, np.float32(1), np.float32(-1))
        else:
            lo, hi = bounds(p["signed"], p["narrow"], bits)
            y = _ROUNDING[p["rounding"]](np.clip(y, lo, hi))
        q = (y - zeropt).astype(np.int64)
        self.describe(node, bits, p["signed"], p["narrow"], scale, p["rounding"])
        return q, scale, self.axis_of(node, scale, w)

    def axis_of(self, node: onnx.NodeProto, scale: np.ndarray, w: np.ndarray) -> "int | None":
        if scale.size == 1:
            return None
        axes = [i for i, d in enumerate(scale.shape[::-1]) if d != 1]
        if len(axes) != 1 or scale.ndim > w.ndim:
            raise ModelError(f"{label(node)} has a scale of shape {list(scale.shape)}; hwonnx "
                             f"reads per-tensor and per-channel (one axis) scales")
        axis = w.ndim - 1 - axes[0]
        if w.shape[axis] != scale.size:
            raise ModelError(f"{label(node)} has {scale.size} scales, which do not fit axis "
                             f"{axis} of '{node.input[0]}' of shape {list(w.shape)}")
        return axis

    def dequantize(self, node, q: np.ndarray, scale: np.ndarray, axis, out: str):
        """``DequantizeLinear`` of the integers ``q`` (int8, or int32 beyond 8 bits)."""
        small = q.min(initial=0) >= -128 and q.max(initial=0) <= 127
        dtype = np.int8 if small else np.int32
        if not small and (q.min() < -2 ** 31 or q.max() >= 2 ** 31):
            raise ModelError(f"{label(node)} quantizes '{node.input[0]}' to integers beyond "
                             f"int32")
        q_name = self.const(q.astype(dtype), f"{node.input[0]}_int")
        s_name = self.const(scale.reshape(-1) if axis is not None else
                            scale.reshape(()), f"{node.input[0]}_scale")
        z_name = self.const(np.zeros(scale.size if axis is not None else (), dtype),
                            f"{node.input[0]}_zero_point")
        kwargs = {"axis": axis} if axis is not None else {}
        return helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [out],
                                name=node.name, **kwargs)

    def run(self) -> None:
        graph = self.graph
        self.infer_shapes()
        self.extra: "list[onnx.NodeProto]" = []
        nodes: "list[onnx.NodeProto]" = []
        for node in graph.node:                                  # channels last first
            if node.domain == CHANNELS_LAST_DOMAIN:
                nodes += self.channels_last(node)
            else:
                nodes.append(node)
        nodes = cancel_transposes(self.extra + nodes, {v.name for v in graph.output})
        nodes = self.typed_inputs(nodes) + nodes
        self.order = nodes
        self.producers = {out: n for n in nodes for out in n.output}
        weights: "dict[str, list]" = {}          # quantized constant -> [q, scale, axis, node]
        for node in nodes:
            if node.domain not in QONNX_DOMAINS:
                continue
            if node.op_type == "FloatQuant":
                raise ModelError(f"{label(node)} is a floating-point (minifloat, fp8) "
                                 f"quantizer; hwonnx's arithmetic is integer: FloatQuant is "
                                 f"not supported")
            if node.op_type not in _QUANT_OPS:
                raise ModelError(f"{label(node)} of domain '{node.domain}' is not supported; "
                                 f"hwonnx reads Quant, IntQuant, BipolarQuant and Trunc")
            need = {"BipolarQuant": 2, "Trunc": 5}.get(node.op_type, 4)
            if len(node.input) < need or not node.input[0] or not node.output[:1] \
                    or not node.output[0]:
                raise ModelError(f"{label(node)} has {len(node.input)} input(s); "
                                 f"{node.op_type} needs {need}, the first one named, and an "
                                 f"output")
            if node.op_type != "Trunc" and node.input[0] in self.consts:
                weights[node.output[0]] = [*self.weight_constant(node), node]
        nodes = self.fold_batchnorm(nodes, weights)
        nodes = self.drop_relus(nodes, weights)
        self.readers: "dict[str, int]" = {}
        for node in nodes:
            for value in node.input:
                self.readers[value] = self.readers.get(value, 0) + 1
        self.producers = {out: n for n in nodes for out in n.output}
        self.removed: "set[int]" = set()
        self.prefix: "list[onnx.NodeProto]" = []
        self.bipolar: "set[str]" = set()
        self.threshold_layers(nodes, weights)
        self.widen(nodes, weights)
        done: "list[onnx.NodeProto]" = []
        for node in nodes:
            if node.domain not in QONNX_DOMAINS:
                done.append(node)
            elif node.op_type == "Trunc":
                done += self.trunc(node)
            elif node.output[0] in weights:
                q, scale, axis, _ = weights[node.output[0]]
                done.append(self.dequantize(node, q, scale, axis, node.output[0]))
            else:
                done += self.activation(node)
        done = self.prefix + [n for n in done if id(n) not in self.removed]
        del graph.node[:]
        graph.node.extend(done)
        graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in self.added.items())

    def dequantize_named(self, q: np.ndarray, scale: np.float32, out: str):
        z = np.zeros((), q.dtype)
        return helper.make_node("DequantizeLinear", [
            self.const(q, f"{out}_int"), self.const(np.asarray(scale, np.float32),
                                                     f"{out}_scale"),
            self.const(z, f"{out}_zero_point")], [out], name=self.fresh(f"{out}_dequantize"))

    def channels_of(self, value: str, node: onnx.NodeProto) -> int:
        """The channels of ``value``, from the layer or graph input that sets them."""
        inputs = {v.name: v for v in self.graph.input}
        seen = 0
        while seen < len(self.order):
            seen += 1
            if value in inputs:
                dims = inputs[value].type.tensor_type.shape.dim
                if len(dims) == 4 and dims[1].HasField("dim_value"):
                    return int(dims[1].dim_value)
                break
            producer = self.producers.get(value)
            if producer is None:
                break
            if is_default_domain(producer.domain) and producer.op_type in ("Conv", "Gemm") \
                    and len(producer.input) > 1:
                weight = producer.input[1]
                source = self.producers.get(weight)
                array = self.consts.get(weight)
                if array is None and source is not None:
                    array = self.consts.get(source.input[0])
                if array is not None and array.ndim == 4:
                    return int(array.shape[0])
                break
            value = producer.input[0]
        raise ModelError(f"{label(node)}: hwonnx cannot tell the channels of '{value}' "
                         f"before shape inference (no Conv or graph input of known channels "
                         f"before it)")


def rewrite_qonnx(model: onnx.ModelProto, rlog: ReadLog
                  ) -> "tuple[list[dict], set[str], dict[str, tuple[str, str]]]":
    """Rewrite the QONNX nodes of ``model`` (in place) into QDQ form (see the module) and
    return a description of each quantizer (``node``, ``op``, ``layer`` and ``role`` there
    (``"weights"``, ``"bias"``, ``"output"``, ``"input"``), ``bits``, ``signed``, ``narrow``,
    ``scale`` (power-of-two or arbitrary, per tensor or per channel), ``rounding``), and the
    values whose requantization must round half up (a ``Trunc`` with FLOOR or CEIL, whose
    bias makes half up the floor or ceiling), and the tensors the host quantizes to ``±1`` by
    their sign (a ``BipolarQuant`` of an input): value -> ``(mode, quantizer node)``.

    Raises
    ------
    ModelError
        Naming the node: a quantizer parameter computed at run time or out of range, an
        activation quantizer hwonnx cannot map (per channel, more than 8 bits, bipolar, a
        rounding other than half to even), ``FloatQuant``, another QONNX operator.
    """
    rewriter = _QonnxRewriter(model, rlog)
    rewriter.run()
    return rewriter.quantizers, rewriter.half_up, rewriter.signs
