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
- The layer-level rewrites are in :mod:`.qonnx_layers`: channels-last operators as their NCHW
  twins, a ``BatchNormalization`` between a layer and its quantizer folded into the layer,
  bipolar activations as the layer's sign, low-bit weights widened for a float bias.

Semantics are those of the qonnx package's reference executor (``qonnx.custom_op.general``:
``int_quant``, ``binary_quant``, ``trunc_v1``/``trunc_v2``); ``docs/qonnx.md`` describes the
mapping and where it is exact.
"""

import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError
from .common import ReadLog, fresh_name, is_default_domain
from .qonnx_layers import (CHANNELS_LAST_DOMAIN, KNOWN_DOMAINS, QONNX_DOMAINS, RANGES_OF,
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


class _QonnxRewriter(QonnxLayerRewrites):
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

    # -- inputs and quantizers ------------------------------------------------------------
    def typed_inputs(self, nodes: "list[onnx.NodeProto]") -> "list[onnx.NodeProto]":
        """A graph input that qonnx's tensor annotation declares an integer type of at most 8
        bits (``finn_datatype`` ``UINT8``, ``INT4``, ``BIPOLAR``, ...), and that no quantizer
        reads, is quantized with scale 1 (QDQ nodes in front of its readers, which read the
        dequantized copy): exact for the values the type allows, and no calibration data
        needed."""
        kinds = {a.tensor_name: p.value for a in self.graph.quantization_annotation
                 for p in a.quant_parameter_tensor_names if p.key == "finn_datatype"}
        inputs = [v.name for v in self.graph.input if v.name not in self.consts]
        added: "list[onnx.NodeProto]" = []
        for x in inputs:
            kind = kinds.get(x, "")
            match = re.fullmatch(r"(U?)INT(\d+)", kind)
            if kind in ("BIPOLAR", "BINARY"):
                lo, hi = (-1, 1) if kind == "BIPOLAR" else (0, 1)
            elif match and 1 <= int(match.group(2)) <= 8:
                lo, hi = bounds(not match.group(1), False, int(match.group(2)))
            else:
                continue
            readers = [n for n in nodes if x in n.input]
            if not readers or any(n.domain in QONNX_DOMAINS for n in readers):
                continue
            dtype = np.int8 if hi <= 127 else np.uint8
            typed = self.fresh(f"{x}_{kind.lower()}")
            s = self.const(np.array(1.0, np.float32), f"{x}_scale")
            z = self.const(np.array(0, dtype), f"{x}_zero_point")
            q = self.fresh(f"{x}_quantized")
            added.append(helper.make_node("QuantizeLinear", [x, s, z], [q],
                                          name=self.fresh(f"{x}_quantize")))
            # (no Clip: the annotation promises the values, it does not clamp them)
            added.append(helper.make_node("DequantizeLinear", [q, s, z], [typed],
                                          name=self.fresh(f"{x}_dequantize")))
            for node in readers:
                for index, value in enumerate(node.input):
                    if value == x:
                        node.input[index] = typed
            self.rlog.note(f"Input '{x}' holds {kind} values (qonnx's tensor annotation): "
                           f"quantized with scale 1, exactly for values in [{lo}, {hi}]")
        return added

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

    def activation(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        """An activation quantizer as QuantizeLinear -> Clip -> DequantizeLinear (of a copy
        of its input requantized on the array when another quantizer writes that input:
        :meth:`requantize_input`)."""
        copy = self.requantize_input(node) if node.op_type != "BipolarQuant" else []
        return copy + self.quantize_activation(node)

    def quantize_activation(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        x, y = node.input[0], node.output[0]
        if node.output[0] in self.bipolar:
            return self.sign_nodes(node, self.constant_input(node, 1, "scale")
                                   .astype(np.float32))
        if node.op_type == "BipolarQuant":
            return self.sign_input(node)
        p = self.params(node)
        bits, signed, narrow = p["bits"], p["signed"], p["narrow"]
        if p["scale"].size != 1 or p["zeropt"].size != 1:
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{x}' per channel; "
                             f"hwonnx quantizes activations per tensor")
        if bits == 1 and signed:
            if np.any(p["zeropt"] != 0):
                raise ModelError(f"{label(node)} is a 1-bit signed (bipolar) quantizer of the "
                                 f"run-time tensor '{x}' with zero point "
                                 f"{p['zeropt'].reshape(-1)[0]:g}; hwonnx maps bipolar "
                                 f"quantizers of zero point 0")
            return self.sign_input(node, "x/scale")    # (no rounding: a sign)
        if p["rounding"] not in ("ROUND", "HALF_EVEN"):
            raise ModelError(f"{label(node)} rounds the run-time tensor '{x}' with "
                             f"rounding_mode {p['rounding']}; hwonnx requantizes activations "
                             f"with ROUND (half to even)")
        lo, hi = bounds(signed, narrow, bits)
        zeropt = int(p["zeropt"].reshape(-1)[0])
        dtype = np.int8 if lo >= -128 and hi <= 127 else np.uint8
        full = RANGES_OF[np.dtype(dtype)]
        if not (full[0] <= lo and hi <= full[1] and full[0] <= zeropt <= full[1]):
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{x}' to {bits} "
                             f"{'signed' if signed else 'unsigned'} bits with zero point "
                             f"{zeropt}; hwonnx's activations are 2 to 8 bits whose range and "
                             f"zero point fit int8 or uint8")
        self.describe(node, bits, signed, narrow, p["scale"], p["rounding"])
        s = self.const(p["scale"].reshape(()), f"{y}_scale")
        z = self.const(np.array(zeropt, dtype), f"{y}_zero_point")
        q, c = self.fresh(f"{y}_quantized"), self.fresh(f"{y}_clipped")
        nodes = [helper.make_node("QuantizeLinear", [x, s, z], [q], name=node.name)]
        if (lo, hi) != full:            # qonnx clamps x / s + zeropt, the stored integer
            nodes.append(helper.make_node(
                "Clip", [q, self.const(np.array(lo, dtype), f"{y}_min"),
                         self.const(np.array(hi, dtype), f"{y}_max")],
                [c], name=self.fresh(f"{node.name}_clip")))
        else:
            c = q
        nodes.append(helper.make_node("DequantizeLinear", [c, s, z], [y],
                                      name=self.fresh(f"{node.name}_dequantize")))
        return nodes

    def sign_input(self, node: onnx.NodeProto, mode: str = "x") -> "list[onnx.NodeProto]":
        """A ``BipolarQuant`` (``+s`` where ``x >= 0``, else ``-s``; ``mode="x"``) or a 1-bit
        signed ``Quant`` of zero point 0 (where ``x / s >= 0`` in float32; ``mode="x/scale"``)
        of a tensor that no layer writes as its sign (:meth:`threshold_layers`): the host's
        quantization of an input, which computes the sign itself
        (:func:`hwonnx.golden.quantize`, ``sign=mode``);
        QuantizeLinear -> Clip to ``[-1, 1]`` -> DequantizeLinear with scale ``s`` in the
        float graph. Refused later (:func:`hwonnx.quant.ranges.apply_ranges`) if an
        accelerator layer writes the tensor."""
        x = node.input[0]
        scale = self.constant_input(node, 1, "scale").astype(np.float32)
        self.check_scale(node, scale, "scale")
        source = self.producers.get(x)
        if source is not None and source.domain in QONNX_DOMAINS:
            raise ModelError(f"{label(node)} quantizes '{x}', which {label(source)} already "
                             f"quantizes, to ±1; hwonnx maps a bipolar tensor as an input the "
                             f"host quantizes or as the sign of a Conv or Gemm with quantized "
                             f"weights")
        if scale.size != 1:
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{x}' per channel; "
                             f"hwonnx quantizes activations per tensor")
        if x in self.signs and self.signs[x][1] != node.name:
            raise ModelError(f"{label(node)} quantizes '{x}' to ±1 as "
                             f"'{self.signs[x][1]}' does; hwonnx quantizes an input once")
        self.signs[x] = (mode, node.name)
        return self.sign_nodes(node, scale)

    def sign_nodes(self, node: onnx.NodeProto, scale: np.ndarray) -> "list[onnx.NodeProto]":
        """``node``'s output as the QDQ nodes of a quantization to ±1 (int8 -1 .. 1, zero
        point 0) with ``scale``."""
        x, y = node.input[0], node.output[0]
        self.describe(node, 1, True, False, scale, "sign")
        s = self.const(scale.reshape(()), f"{y}_scale")
        z = self.const(np.array(0, np.int8), f"{y}_zero_point")
        q, c = self.fresh(f"{y}_quantized"), self.fresh(f"{y}_clipped")
        return [helper.make_node("QuantizeLinear", [x, s, z], [q], name=node.name),
                helper.make_node("Clip", [q, self.const(np.array(-1, np.int8), f"{y}_min"),
                                          self.const(np.array(1, np.int8), f"{y}_max")],
                                 [c], name=self.fresh(f"{node.name}_clip")),
                helper.make_node("DequantizeLinear", [c, s, z], [y],
                                 name=self.fresh(f"{node.name}_dequantize"))]

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

    def trunc(self, node: onnx.NodeProto) -> "list[onnx.NodeProto]":
        """``Trunc`` (5 inputs: qonnx's ``trunc_v1``; 6: ``trunc_v2``) of a tensor on the grid
        of its ``scale`` (zero point 0): ``R(n / 2^k)`` of its integers ``n``, ``R`` the
        rounding mode, then (v2) clamped to the output bits. It becomes a depthwise
        convolution with weights 1 (a 1x1 copy, or the window of an ``AveragePool`` whose
        ``Mul`` by the window size turns it back into the sum, as Brevitas' ``TruncAvgPool2d``
        exports it) requantized by exactly ``2^-k``: ROUND/HALF_EVEN by the rounding unit (half
        to even), FLOOR and CEIL by half up with the bias ``-2^(k-1)`` or ``2^(k-1) - 1``."""
        attrs = attrs_of(node)
        v2 = len(node.input) >= 6
        version = self.opsets.get(node.domain, 1)
        if v2 != (version >= 2):
            raise ModelError(f"{label(node)} has {len(node.input)} inputs but the model imports "
                             f"{node.domain} version {version}, for which qonnx's executor runs "
                             f"the {'6' if version >= 2 else '5'}-input Trunc")
        if "rounding_mode" not in attrs:
            raise ModelError(f"{label(node)} has no attribute 'rounding_mode'; qonnx's "
                             f"reference executor requires it: set it explicitly")
        rounding = attrs["rounding_mode"]
        rounding = (rounding.decode() if isinstance(rounding, bytes) else rounding).upper()
        if rounding not in ("ROUND", "HALF_EVEN", "FLOOR", "CEIL"):
            raise ModelError(f"{label(node)} has rounding_mode '{rounding}'; hwonnx maps Trunc "
                             f"with ROUND, HALF_EVEN, FLOOR or CEIL")
        scale = self.constant_input(node, 1, "scale").astype(np.float32)
        zeropt = self.constant_input(node, 2, "zero point")
        in_bits = self.bit_width(node, 3, "input bit width")
        if scale.size != 1 or np.any(zeropt != 0):
            raise ModelError(f"{label(node)} has a per-channel scale or a zero point other "
                             f"than 0; hwonnx maps Trunc of a per-tensor grid with zero point 0")
        self.check_scale(node, scale, "scale")
        if v2:
            out_scale = self.constant_input(node, 4, "output scale").astype(np.float32)
            out_bits = self.bit_width(node, 5, "output bit width")
            self.check_scale(node, out_scale, "output scale")
            # both positive and finite: so is their ratio (float64 of float32 values)
            ratio = float(out_scale.reshape(-1)[0]) / float(scale.reshape(-1)[0]) \
                if out_scale.size == 1 else None
            k = int(np.round(np.log2(ratio))) if ratio is not None else -1
            if ratio is None or ratio != 2.0 ** k or k < 0:
                raise ModelError(f"{label(node)} has output scale {out_scale.reshape(-1)[:2]} "
                                 f"and scale {scale.reshape(-1)[0]}; hwonnx maps Trunc whose "
                                 f"output scale is the scale times a power of two (at least 1)")
            signed, narrow = bool(attrs.get("signed", 1)), bool(attrs.get("narrow", 0))
            lo, hi = bounds(signed, narrow, out_bits)
            w_scale, s_out = np.float32(1.0), out_scale.reshape(())
        else:
            out_bits = self.bit_width(node, 4, "output bit width")
            k = in_bits - out_bits
            lo, hi = (-128, 127)
            w_scale, s_out = np.float32(2.0 ** -k), scale.reshape(())
        if k < 0 or k > 24:
            raise ModelError(f"{label(node)} shifts by {k} bits; hwonnx maps 0 to 24")
        if lo < -128 or hi > 127:
            raise ModelError(f"{label(node)} truncates to {out_bits} bits; hwonnx's activations "
                             f"are at most 8 (signed) or 7 (unsigned) bits here")
        x, window = node.input[0], None
        mul = self.producers.get(x)
        pool = self.producers.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" \
            and is_default_domain(mul.domain) else None
        if pool is not None and pool.op_type == "AveragePool" and is_default_domain(pool.domain):
            p_attrs = attrs_of(pool)
            kernel = list(p_attrs.get("kernel_shape", []))
            factor = self.consts.get(mul.input[1])
            if len(kernel) == 2 and factor is not None and factor.size == 1 and \
                    float(factor.reshape(-1)[0]) == kernel[0] * kernel[1] and \
                    not any(p_attrs.get("pads", [])) and \
                    p_attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and \
                    not p_attrs.get("ceil_mode", 0) and self.readers.get(x) == 1 and \
                    self.readers.get(mul.output[0]) == 1 and \
                    self.readers.get(pool.output[0]) == 1:
                window = (kernel, list(p_attrs.get("strides", [1, 1])))
                x = pool.input[0]
                self.removed.update((id(pool), id(mul)))
        source = self.producers.get(x)
        if source is None or source.domain not in QONNX_DOMAINS or \
                source.op_type not in ("Quant", "IntQuant") or \
                source.input[1] not in self.consts or \
                self.consts[source.input[1]].size != 1 or \
                np.float32(self.consts[source.input[1]].reshape(-1)[0]) != scale.reshape(-1)[0] \
                or np.any(self.consts.get(source.input[2], 1) != 0):
            raise ModelError(f"{label(node)} truncates '{x}', which no activation quantizer of "
                             f"scale {scale.reshape(-1)[0]} and zero point 0 writes; hwonnx maps "
                             f"Trunc of a quantized tensor (directly, or through an AveragePool "
                             f"and a Mul by its window size)")
        channels = self.channels_of(x, node)
        kernel, strides = window or ([1, 1], [1, 1])
        y = node.output[0]
        conv_out = self.fresh(f"{y}_sum")
        weight = self.fresh(f"{y}_weight")
        nodes = [self.dequantize_named(np.ones((channels, 1, *kernel), np.int8),
                                       np.float32(w_scale), weight)]
        bias_int = {"FLOOR": -(2 ** (k - 1)) if k else 0,
                    "CEIL": 2 ** (k - 1) - 1 if k else 0}.get(rounding, 0)
        bias = self.fresh(f"{y}_bias")
        acc_scale = np.float32(scale.reshape(-1)[0] * w_scale)
        nodes.append(self.dequantize_named(np.full(channels, bias_int, np.int32), acc_scale,
                                           bias))
        nodes.append(helper.make_node("Conv", [x, weight, bias], [conv_out], name=node.name,
                                      group=channels, kernel_shape=kernel, strides=strides))
        self.quantizers.append({"node": node.name, "op": "Trunc", "layer": node.name,
                                "role": "output", "bits": out_bits, "signed": lo < 0,
                                "narrow": False, "scale": "power-of-two shift", "rounding":
                                rounding})
        s = self.const(np.asarray(s_out, np.float32), f"{y}_scale")
        z = self.const(np.array(0, np.int8), f"{y}_zero_point")
        q, c = self.fresh(f"{y}_quantized"), self.fresh(f"{y}_clipped")
        nodes.append(helper.make_node("QuantizeLinear", [conv_out, s, z], [q],
                                      name=self.fresh(f"{node.name}_quantize")))
        if (lo, hi) != (-128, 127):
            nodes.append(helper.make_node(
                "Clip", [q, self.const(np.array(lo, np.int8), f"{y}_min"),
                         self.const(np.array(hi, np.int8), f"{y}_max")], [c],
                name=self.fresh(f"{node.name}_clip")))
        else:
            c = q
        nodes.append(helper.make_node("DequantizeLinear", [c, s, z], [y],
                                      name=self.fresh(f"{node.name}_dequantize")))
        if rounding in ("FLOOR", "CEIL"):         # the bias does it, with half-up rounding
            self.half_up.update((conv_out, q, c, y))
        return nodes

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
