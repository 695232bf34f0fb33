"""Import of models already quantized by onnxruntime: QDQ models (``QuantizeLinear`` /
``DequantizeLinear`` around float operators) and QOperator models (``QLinearConv``,
``QLinearMatMul``, ``MatMulInteger``, ``ConvInteger`` and onnxruntime's ``com.microsoft``
``QLinearAdd``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QGemm``,
``QLinearSigmoid``, ``QLinearLeakyRelu``; an int8 ``MaxPool`` needs no rewrite).

:func:`dequantize_model` rewrites such a model, in place and before the support check, into
the ordinary float model it encodes: an integer run-time tensor becomes the float tensor it
stands for (same name), ``QuantizeLinear``/``DequantizeLinear`` of a run-time tensor become
``Identity`` (removed by the ``remove-identity`` pass), a ``DequantizeLinear`` of a constant
becomes a float initializer holding the dequantized values (exactly representable), and each
QOperator node becomes its float operator on dequantized weights. The integers and
parameters read on the way are kept in :class:`Annotations`; :func:`annotate_graph` turns
them into ``graph.meta["quantization"]`` (keyed by the final value and constant names) once
the float pass pipeline has run. A uint8 tensor becomes int8 by subtracting 128 from its
values and its zero point, which changes no real value. The QOperator rewrites are in
:mod:`.qoperator`, the annotations in :mod:`.annotate`; ``docs/arithmetic.md`` ("Pre-quantized
models") describes the whole import.
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError
from .annotate import Annotations, IntegerConstant, annotate_graph
from .common import FLOAT_TYPES, elem_type_name, fresh_name, is_default_domain
from .qoperator import RANGES, QOperatorRewrites, attrs_of, int8_of, label

__all__ = ["MS_DOMAIN", "QUANTIZED_OPS", "Annotations", "IntegerConstant", "is_prequantized",
           "dequantize_model", "annotate_graph"]

MS_DOMAIN = "com.microsoft"
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
_ONNX_OPS = _QDQ_OPS | {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger"}
_MS_OPS = _QDQ_OPS | {"QLinearAdd", "QLinearGlobalAveragePool", "QLinearAveragePool", "QGemm",
                      "QLinearSigmoid", "QLinearLeakyRelu"}
#: The ``(domain, operator)`` pairs :func:`dequantize_model` rewrites (``""``: ai.onnx).
QUANTIZED_OPS = frozenset({("", op) for op in _ONNX_OPS} | {(MS_DOMAIN, op) for op in _MS_OPS})
#: The inputs each rewrite reads by position: a node with fewer is refused (the signature check
#: of the rewritten model comes later).
_MIN_INPUTS = {"QuantizeLinear": 2, "DequantizeLinear": 2, "QLinearConv": 8, "QLinearMatMul": 8,
               "QGemm": 6, "QLinearAdd": 7, "QLinearGlobalAveragePool": 4,
               "QLinearAveragePool": 4, "MatMulInteger": 2, "ConvInteger": 2,
               "QLinearSigmoid": 4, "QLinearLeakyRelu": 4}
_TENSOR = onnx.AttributeProto.TENSOR
#: Operators whose output holds values of their input: on its quantization grid.
_GRID_KEEPING = ("MaxPool", "Resize", "Upsample", "Transpose", "DepthToSpace")


def _is_quantized_op(node: onnx.NodeProto) -> bool:
    domain = "" if is_default_domain(node.domain) else node.domain
    return (domain, node.op_type) in QUANTIZED_OPS


def is_prequantized(model: onnx.ModelProto) -> bool:
    """Return whether the main graph holds any operator of :data:`QUANTIZED_OPS`."""
    return any(_is_quantized_op(node) for node in model.graph.node)


class _Rewriter(QOperatorRewrites):
    """Rewrites the nodes of a model's main graph into float operators (see the module)."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.graph = graph
        self.consts = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and is_default_domain(node.domain) and node.output \
                    and [(a.name, a.type) for a in node.attribute] == [("value", _TENSOR)]:
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.taken = set(self.consts) | {v.name for v in (*graph.input, *graph.output)} | \
            {v for node in graph.node for v in node.output}
        self.consumers: "dict[str, list[onnx.NodeProto]]" = {}
        for node in graph.node:
            for value in node.input:
                self.consumers.setdefault(value, []).append(node)
        qoperator = any(_is_quantized_op(n) and n.op_type not in _QDQ_OPS for n in graph.node)
        self.ann = Annotations("qoperator" if qoperator else "qdq")
        self.added: "dict[str, np.ndarray]" = {}
        self.nodes: "list[onnx.NodeProto]" = []
        self.consumed: "set[str]" = set()             # names of nodes absorbed by a pattern
        self.quantized: "dict[str, np.dtype]" = {}    # run-time QuantizeLinear output -> type
        self.q_source: "dict[str, str]" = {}          # ... -> the float tensor it quantizes

    # -- parameters -----------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        return fresh_name(self.taken, base)

    def constant(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray:
        name = node.input[index] if index < len(node.input) else ""
        if name not in self.consts:
            raise ModelError(f"{label(node)} needs a constant {what}, but '{name}' is computed "
                             f"at run time; hwonnx imports static quantization parameters only")
        return self.consts[name]

    def scale_zp(self, node: onnx.NodeProto, s_index: int, z_index: int
                 ) -> "tuple[np.ndarray, np.ndarray]":
        scale = self.constant(node, s_index, "scale")
        if scale.dtype.kind != "f" or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise ModelError(f"{label(node)} has scale '{node.input[s_index]}' = "
                             f"{scale.reshape(-1)[:4].tolist()}; scales must be positive finite "
                             f"floats")
        if z_index < len(node.input) and node.input[z_index]:
            zero_point = self.constant(node, z_index, "zero point")
        else:       # ONNX: absent means 0 of the integer type (QuantizeLinear: uint8)
            q = self.consts.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
            zero_point = np.zeros(scale.shape, np.uint8 if q is None else q.dtype)
        if zero_point.dtype not in (np.int8, np.uint8, np.int32):
            raise ModelError(f"{label(node)} has a {zero_point.dtype} zero point; hwonnx "
                             f"imports int8 and uint8 tensors (and int32 biases)")
        if zero_point.size not in (1, scale.size):
            raise ModelError(f"{label(node)} has {scale.size} scale(s) but "
                             f"{zero_point.size} zero points")
        return scale.astype(np.float32), zero_point

    def activation_params(self, node: onnx.NodeProto, s_index: int, z_index: int,
                          value: str) -> "tuple[float, int]":
        scale, zero_point = self.scale_zp(node, s_index, z_index)
        if scale.size != 1 or zero_point.size != 1:
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{value}' per axis; "
                             f"hwonnx quantizes activations per tensor")
        if zero_point.dtype not in RANGES:
            raise ModelError(f"{label(node)} quantizes the run-time tensor '{value}' to "
                             f"{zero_point.dtype}; hwonnx's activations are int8 or uint8")
        return float(scale.reshape(-1)[0]), int(int8_of(zero_point).reshape(-1)[0])

    def record(self, node: onnx.NodeProto, value: str, params: "tuple[float, int]") -> None:
        old = self.ann.activations.setdefault(value, params)
        if old != params:
            raise ModelError(f"{label(node)} gives '{value}' scale {params[0]:.6g} and zero "
                             f"point {params[1]}, but it already has scale {old[0]:.6g} and zero "
                             f"point {old[1]} (zero points as int8); hwonnx keeps one set of "
                             f"quantization parameters per tensor")

    def operand(self, node: onnx.NodeProto, index: int, s_index: int, z_index: int,
                axis: "int | None" = None) -> str:
        """The float name of quantized input ``index``: a constant is dequantized into a new
        float initializer, a run-time tensor keeps its name and has its parameters recorded."""
        name = node.input[index]
        if name in self.consts:
            return self.dequantize_constant(node, name, *self.scale_zp(node, s_index, z_index),
                                            axis)
        self.record(node, name, self.activation_params(node, s_index, z_index, name))
        return name

    def axis_shape(self, node: onnx.NodeProto, q: np.ndarray, scale: np.ndarray,
                   axis: "int | None") -> "tuple[tuple[int, ...], int | None]":
        """The broadcast shape of a per-axis ``scale`` against ``q``, and the axis."""
        if scale.size == 1 and scale.ndim <= 1:
            return (), None
        axis = 1 if axis is None else axis
        axis = axis + q.ndim if axis < 0 else axis
        if scale.ndim != 1 or not 0 <= axis < q.ndim or q.shape[axis] != scale.size:
            raise ModelError(f"{label(node)} has {scale.size} scales along axis {axis}, which "
                             f"does not fit a tensor of shape {list(q.shape)}")
        shape = [1] * q.ndim
        shape[axis] = -1
        return tuple(shape), axis

    def dequantize_constant(self, node: onnx.NodeProto, name: str, scale: np.ndarray,
                            zero_point: np.ndarray, axis: "int | None",
                            out: "str | None" = None) -> str:
        """Add the float initializer ``(q - zero_point) * scale`` of the integer constant
        ``name`` (named ``out``, or a fresh name) and record its integers."""
        q = self.consts[name]
        if q.dtype not in (np.int8, np.uint8, np.int32) or \
                (q.dtype == np.int32) != (zero_point.dtype == np.int32):
            raise ModelError(f"{label(node)} dequantizes '{name}' of type {q.dtype} with a "
                             f"{zero_point.dtype} zero point; hwonnx reads 8-bit weights and "
                             f"int32 biases")
        shape, axis = self.axis_shape(node, q, scale, axis)
        bits = 32 if q.dtype == np.int32 else 8
        q_int = q.astype(np.int64) if bits == 32 else int8_of(q)
        zp_int = zero_point.astype(np.int64) if bits == 32 else int8_of(zero_point)
        with np.errstate(over="ignore"):
            value = (q_int - zp_int.reshape(shape)).astype(np.float32) * \
                scale.astype(np.float32).reshape(shape)
        if not np.all(np.isfinite(value)):
            raise ModelError(f"{label(node)} dequantizes '{name}' with scale up to "
                             f"{float(scale.max()):.6g} to values beyond float32")
        out = out or self.fresh(f"{name}_dequantized")
        self.consts[out] = self.added[out] = value
        self.ann.integers[out] = IntegerConstant(
            q_int.astype(np.int32 if bits == 32 else np.int8), zp_int.reshape(-1),
            scale.astype(np.float32).reshape(-1), axis, value, bits)
        return out

    def bias(self, node: onnx.NodeProto, index: int, scale: np.ndarray) -> str:
        """Dequantize the int32 bias input ``index``, whose scale is input scale x weight
        scale (``scale``, per channel or per tensor) and zero point 0."""
        self.constant(node, index, "bias")
        return self.dequantize_constant(node, node.input[index], scale.astype(np.float32),
                                        np.zeros(1, np.int32), 0 if scale.size > 1 else None)

    def emit(self, node: onnx.NodeProto, op: str, inputs, outputs=None, drop=None) -> None:
        """Append ``op`` named like ``node`` with ``node``'s attributes but those in ``drop``
        (all of them when ``drop`` is None)."""
        new = helper.make_node(op, list(inputs), list(outputs or node.output), name=node.name)
        if drop is not None:
            new.attribute.extend(a for a in node.attribute if a.name not in drop)
        self.nodes.append(new)

    # -- operators ------------------------------------------------------------------------
    def quantize_linear(self, node: onnx.NodeProto) -> None:
        if attrs_of(node).get("block_size", 0):
            raise ModelError(f"{label(node)} is blocked; hwonnx imports per-tensor and "
                             f"per-axis quantization")
        x = node.input[0]
        if x not in self.consts:
            params = self.activation_params(node, 1, 2, x)
            self.record(node, x, params)
            self.record(node, node.output[0], params)
            self.quantized[node.output[0]] = self.scale_zp(node, 1, 2)[1].dtype
            self.q_source[node.output[0]] = x
            self.emit(node, "Identity", [x])
            return
        scale, zero_point = self.scale_zp(node, 1, 2)         # a constant quantized in-graph
        if zero_point.dtype not in RANGES:
            raise ModelError(f"{label(node)} quantizes '{x}' to {zero_point.dtype}; hwonnx "
                             f"reads 8-bit weights")
        shape, _ = self.axis_shape(node, self.consts[x], scale, attrs_of(node).get("axis"))
        real = self.consts[x]
        real = real.astype(np.float64) if real.dtype.kind in "fiub" else np.full(1, np.nan)
        if not np.all(np.isfinite(real)):
            raise ModelError(f"{label(node)} quantizes the constant '{x}', which holds NaN, "
                             f"infinite or non-real values")
        q = np.rint(real / scale.astype(np.float64).reshape(shape)) + \
            zero_point.astype(np.float64).reshape(shape)
        self.consts[node.output[0]] = self.added[node.output[0]] = np.clip(
            q, *RANGES[zero_point.dtype]).astype(zero_point.dtype)

    def dequantize_linear(self, node: onnx.NodeProto) -> None:
        if attrs_of(node).get("block_size", 0):
            raise ModelError(f"{label(node)} is blocked; hwonnx imports per-tensor and "
                             f"per-axis quantization")
        q = node.input[0]
        if q in self.consts:
            self.dequantize_constant(node, q, *self.scale_zp(node, 1, 2),
                                     attrs_of(node).get("axis"), node.output[0])
            return
        params = self.activation_params(node, 1, 2, q)
        self.record(node, q, params)
        self.record(node, node.output[0], params)
        if q in self.ann.ranges:
            self.ann.ranges[node.output[0]] = self.ann.ranges[q]
        self.emit(node, "Identity", [q])

    def clip(self, node: onnx.NodeProto) -> None:
        """The ``Clip`` of the QCDQ form (QuantizeLinear -> Clip -> DequantizeLinear) that
        narrows an integer tensor to fewer bits: evaluated on a constant, recorded as the
        clamp range of a run-time tensor (as int8: uint8 bounds shifted by -128)."""
        x = node.input[0]
        bounds = []
        for index, default in ((1, RANGES[np.dtype(self.quantized.get(x, np.int8))][0]),
                               (2, RANGES[np.dtype(self.quantized.get(x, np.int8))][1])):
            if index < len(node.input) and node.input[index]:
                bound = self.constant(node, index, "bound")
                if bound.size != 1 or bound.dtype.kind not in "iu":
                    raise ModelError(f"{label(node)} clips the integer tensor '{x}' with a "
                                     f"bound that is not one integer")
                bounds.append(int(bound.reshape(-1)[0]))
            else:
                bounds.append(default)
        if x in self.consts:
            self.consts[node.output[0]] = self.added[node.output[0]] = np.clip(
                self.consts[x], *bounds).astype(self.consts[x].dtype)
            return
        shift = 128 if self.quantized[x] == np.uint8 else 0
        lo, hi = max(bounds[0] - shift, -128), min(bounds[1] - shift, 127)
        if lo > hi:
            raise ModelError(f"{label(node)} clips '{x}' to the empty range [{bounds[0]}, "
                             f"{bounds[1]}]")
        old = self.ann.ranges.get(x, (-128, 127))
        rng = (max(lo, old[0]), min(hi, old[1]))
        for value in (self.q_source.get(x), x, node.output[0]):
            if value is not None:
                self.ann.ranges[value] = rng
        self.record(node, node.output[0], self.ann.activations[x])
        self.quantized[node.output[0]] = self.quantized[x]
        self.q_source[node.output[0]] = self.q_source.get(x)
        self.emit(node, "Identity", [x])

    HANDLERS = {
        "QuantizeLinear": "quantize_linear", "DequantizeLinear": "dequantize_linear",
        "QLinearConv": "qlinear_conv", "QLinearMatMul": "qlinear_matmul", "QGemm": "qgemm",
        "QLinearAdd": "qlinear_add", "QLinearGlobalAveragePool": "qlinear_pool",
        "QLinearAveragePool": "qlinear_pool", "MatMulInteger": "integer_op",
        "ConvInteger": "integer_op", "QLinearSigmoid": "qlinear_unary",
        "QLinearLeakyRelu": "qlinear_unary",
    }

    def run(self) -> None:
        graph = self.graph
        for value in graph.output:
            elem_type = value.type.tensor_type.elem_type
            if elem_type not in FLOAT_TYPES:
                raise ModelError(f"Graph output '{value.name}' has type "
                                 f"{elem_type_name(elem_type)}; hwonnx's outputs are float: "
                                 f"end the model with a DequantizeLinear")
        for node in graph.node:
            if node.output[:1] and node.output[0] in self.consumed:
                continue
            if _is_quantized_op(node):
                _check_arity(node)
                getattr(self, self.HANDLERS[node.op_type])(node)
            elif node.op_type == "Clip" and is_default_domain(node.domain) and node.input[:1] \
                    and (node.input[0] in self.quantized or node.input[0] in self.consts and
                         self.consts[node.input[0]].dtype in RANGES):
                self.clip(node)
            elif node.op_type == "Add" and is_default_domain(node.domain):
                self.add(node, list(node.input))
            else:
                self.nodes.append(node)
        self.nodes = [self._gemm_weight(n) if n.op_type == "Gemm" and
                      is_default_domain(n.domain) else n for n in self.nodes]
        self._propagate()
        outputs = {v.name for v in graph.output}
        used = {v for n in self.nodes for v in n.input} | outputs
        inputs = {v.name for v in graph.input}
        kept = [i for i in graph.initializer if i.name in used or i.name in inputs]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.initializer.extend(numpy_helper.from_array(value, name)
                                 for name, value in self.added.items() if name in used)
        del graph.node[:]
        graph.node.extend(self.nodes)
        del graph.value_info[:]                  # integer types are now float: infer again

    def _propagate(self) -> None:
        """Give parameters to the float tensors onnxruntime left between quantized ones where
        they are exact: a ``Relu``, ``MaxPool``, nearest ``Resize``/``Upsample``,
        ``Transpose``, ``DepthToSpace`` output is on its input's grid, and a ``Flatten``,
        ``Reshape``, ``Identity`` or ``Transpose`` output on its input's (either way round)."""
        acts = self.ann.activations
        same = [n for n in self.nodes if is_default_domain(n.domain) and n.op_type in
                ("Relu", "Flatten", "Reshape", "Identity", *_GRID_KEEPING) and n.input[:1]
                and n.output[:1] and n.input[0] not in self.consts and
                attrs_of(n).get("mode", b"nearest") in (b"nearest", "nearest", b"DCR", b"CRD")]
        for node in same:
            if node.input[0] in acts and node.output[0] not in acts:
                acts[node.output[0]] = acts[node.input[0]]
                if node.input[0] in self.ann.ranges and node.op_type != "Relu":
                    self.ann.ranges[node.output[0]] = self.ann.ranges[node.input[0]]
        for node in reversed(same):
            if node.op_type in ("Flatten", "Reshape", "Identity", "Transpose", "DepthToSpace") \
                    and \
                    node.output[0] in acts and node.input[0] not in acts:
                acts[node.input[0]] = acts[node.output[0]]
                if node.output[0] in self.ann.ranges:
                    self.ann.ranges[node.input[0]] = self.ann.ranges[node.output[0]]

    def _gemm_weight(self, node: onnx.NodeProto) -> onnx.NodeProto:
        """Give a ``Gemm`` with ``transB=1`` on a dequantized weight a transposed copy of it,
        so that the float graph's weight constant keeps the recorded integers."""
        attrs = attrs_of(node)
        weight = node.input[1] if len(node.input) > 1 else ""
        if not attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0 \
                or weight not in self.ann.integers:
            return node
        name = self.fresh(f"{weight}_transposed")
        record = self.ann.integers[weight].transposed()
        self.ann.integers[name] = record
        self.consts[name] = self.added[name] = np.ascontiguousarray(record.value)
        new = helper.make_node("Gemm", [node.input[0], name, *node.input[2:]], node.output,
                               name=node.name)
        new.attribute.extend(a for a in node.attribute if a.name != "transB")
        return new


def _check_arity(node: onnx.NodeProto) -> None:
    """Refuse a quantized node without the inputs its rewrite reads or without an output."""
    need = _MIN_INPUTS[node.op_type]
    if len(node.input) < need or not node.input[0] or not node.output[:1] \
            or not node.output[0]:
        raise ModelError(f"{label(node)} has {len(node.input)} input(s) and "
                         f"{len(node.output)} output(s); {node.op_type} needs at least {need} "
                         f"inputs, the first one named, and an output")


def dequantize_model(model: onnx.ModelProto) -> Annotations:
    """Rewrite the pre-quantized ``model`` (in place) into the float model it encodes and
    return what it says about its quantization (see the module).

    Raises
    ------
    ModelError
        If a quantization parameter is not a constant, a run-time tensor is quantized per
        axis, to a type other than int8/uint8, or twice with different parameters, a
        ``MatMulInteger``/``ConvInteger`` is not followed by ``Cast`` and ``Mul`` by a
        constant, or a graph output is an integer tensor.
    """
    rewriter = _Rewriter(model)
    rewriter.run()
    return rewriter.ann
