"""The rewrites of QOperator nodes (and of a constant ``Add``) into float operators on
dequantized weights, part of the pre-quantized model import of :mod:`.prequant`."""

import numpy as np
import onnx
from onnx import helper

from ..errors import ModelError
from .annotate import IntegerConstant

__all__ = ["RANGES", "QOperatorRewrites", "attrs_of", "int8_of", "label"]

#: Value range of the 8-bit types hwonnx imports.
RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def int8_of(array: np.ndarray) -> np.ndarray:
    """int8 (as int64) from int8 or uint8 values: uint8 is shifted by -128."""
    shift = 128 if array.dtype == np.uint8 else 0
    return array.astype(np.int64) - shift


def attrs_of(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name}'"


class QOperatorRewrites:
    """Methods of the pre-quantized model rewriter (:class:`.prequant._Rewriter`) for the
    QOperator nodes; they use its ``operand``, ``record``, ``scale_zp``, ``emit`` ..."""

    def qlinear_conv(self, node: onnx.NodeProto) -> None:
        inputs = [self.operand(node, 0, 1, 2), self.operand(node, 3, 4, 5, axis=0)]
        if len(node.input) > 8 and node.input[8]:
            x_scale, w_scale = self.scale_zp(node, 1, 2)[0], self.scale_zp(node, 4, 5)[0]
            inputs.append(self.bias(node, 8, x_scale * w_scale))
        self.record(node, node.output[0], self.activation_params(node, 6, 7, node.output[0]))
        self.emit(node, "Conv", inputs, drop={"channels_last"})

    def qlinear_matmul(self, node: onnx.NodeProto) -> None:
        inputs = [self.operand(node, 0, 1, 2), self.operand(node, 3, 4, 5, axis=-1)]
        self.record(node, node.output[0], self.activation_params(node, 6, 7, node.output[0]))
        self.emit(node, "MatMul", inputs, drop=())

    def qgemm(self, node: onnx.NodeProto) -> None:
        attrs = attrs_of(node)
        if attrs.get("alpha", 1.0) != 1.0:
            raise ModelError(f"{label(node)} has alpha={attrs['alpha']:g}; hwonnx imports "
                             f"QGemm with alpha=1 only")
        inputs = [self.operand(node, 0, 1, 2),
                  self.operand(node, 3, 4, 5, axis=0 if attrs.get("transB", 0) else 1)]
        if len(node.input) > 6 and node.input[6]:
            a_scale, b_scale = self.scale_zp(node, 1, 2)[0], self.scale_zp(node, 4, 5)[0]
            inputs.append(self.bias(node, 6, a_scale * b_scale))
        if len(node.input) > 7 and node.input[7]:
            self.record(node, node.output[0],
                        self.activation_params(node, 7, 8, node.output[0]))
        self.emit(node, "Gemm", inputs, drop={"alpha"})

    def qlinear_add(self, node: onnx.NodeProto) -> None:
        inputs = [self.operand(node, 0, 1, 2), self.operand(node, 3, 4, 5)]
        self.record(node, node.output[0], self.activation_params(node, 6, 7, node.output[0]))
        self.add(node, inputs)

    def add(self, node: onnx.NodeProto, inputs: "list[str]") -> None:
        """An ``Add`` of a quantized run-time tensor and a per-channel constant becomes a
        1x1 layer with identity weights (64 * 2**-6 = 1, exact) and the constant as bias, so
        that the tensor keeps its own int8 requantization and saturation, as in
        onnxruntime, instead of being fused into the layer before it by ``fuse-bias``."""
        const = [v for v in inputs if v in self.consts]
        x = next((v for v in inputs if v not in self.consts), None)
        shape = self.consts[const[0]].shape if len(const) == 1 else None
        if x not in self.ann.activations or shape is None or \
                not (len(shape) <= 2 or shape[-2:] == (1, 1) and len(shape) in (3, 4)) or \
                sum(d != 1 for d in shape) > 1:
            self.emit(node, "Add", inputs, drop=())
            return
        channels = int(np.prod(shape))
        dense = len(shape) <= 2
        identity = np.eye(channels, dtype=np.float32) if dense else \
            np.ones((channels, 1, 1, 1), np.float32)
        weight = self.fresh(f"{node.name}_identity")
        self.consts[weight] = self.added[weight] = identity
        self.ann.integers[weight] = IntegerConstant(
            (identity * 64).astype(np.int8), np.zeros(1, np.int64),
            np.full(channels, 2.0 ** -6, np.float32), 1 if dense else 0, identity, 8)
        bias = self.fresh(f"{node.name}_bias")
        self.consts[bias] = self.added[bias] = \
            self.consts[const[0]].reshape(channels).astype(np.float32)
        if dense:
            self.emit(node, "Gemm", [x, weight, bias], drop=())
        else:
            self.nodes.append(helper.make_node("Conv", [x, weight, bias], list(node.output),
                                               name=node.name, group=channels))

    def qlinear_pool(self, node: onnx.NodeProto) -> None:
        if attrs_of(node).get("channels_last", 0):
            raise ModelError(f"{label(node)} has channels_last=1; hwonnx reads NCHW tensors")
        x = self.operand(node, 0, 1, 2)
        self.record(node, node.output[0], self.activation_params(node, 3, 4, node.output[0]))
        self.emit(node, node.op_type.replace("QLinear", ""), [x], drop={"channels_last"})

    def qlinear_unary(self, node: onnx.NodeProto) -> None:
        """``QLinearSigmoid`` / ``QLinearLeakyRelu`` (X, X_scale, X_zero_point, Y_scale,
        Y_zero_point): the float activation between the recorded parameters, which the
        quantizer turns into a lookup table as onnxruntime computes it."""
        x = self.operand(node, 0, 1, 2)
        self.record(node, node.output[0], self.activation_params(node, 3, 4, node.output[0]))
        self.emit(node, node.op_type.replace("QLinear", ""), [x], drop=set())

    def integer_op(self, node: onnx.NodeProto) -> None:
        """``MatMulInteger``/``ConvInteger`` followed by ``Cast`` to float and ``Mul`` by a
        constant scale, as one ``MatMul``/``Conv`` on dequantized weights."""
        conv = node.op_type == "ConvInteger"
        x = node.input[0]
        if x not in self.ann.activations:
            raise ModelError(f"{label(node)} reads '{x}', whose scale is not known before run "
                             f"time; hwonnx needs '{x}' written by a QuantizeLinear with "
                             f"constant parameters")
        cast = self._sole_consumer(node.output[0])
        mul = self._sole_consumer(cast.output[0]) if cast is not None else None
        others = [v for v in (mul.input if mul is not None else ()) if v != cast.output[0]]
        if cast is None or cast.op_type != "Cast" or \
                attrs_of(cast).get("to") != onnx.TensorProto.FLOAT or mul is None or \
                mul.op_type != "Mul" or len(others) != 1 or others[0] not in self.consts:
            raise ModelError(f"{label(node)} must be followed by a Cast to float and a Mul by "
                             f"a constant scale (its int32 result has no scale of its own)")
        x_scale, x_zp = self.ann.activations[x]
        if len(node.input) > 2 and node.input[2] and \
                int(int8_of(self.constant(node, 2, "zero point")).reshape(-1)[0]) != x_zp:
            raise ModelError(f"{label(node)} subtracts a zero point from '{x}' other than the "
                             f"one '{x}' is quantized with ({x_zp} as int8)")
        w = self.constant(node, 1, "weight")
        combined = self.consts[others[0]].astype(np.float64)
        channels = w.shape[0] if conv else w.shape[-1]
        shapes = ((channels, 1, 1), (1, channels, 1, 1)) if conv else ((channels,),
                                                                        (1, channels))
        if combined.size != 1 and combined.shape not in shapes:
            raise ModelError(f"{label(node)} is scaled by '{others[0]}' of shape "
                             f"{list(combined.shape)}; it must be a scalar or hold one scale "
                             f"per output channel")
        w_zp = self.constant(node, 3, "zero point") if len(node.input) > 3 and node.input[3] \
            else np.zeros(1, w.dtype)
        if w.dtype not in RANGES or w_zp.dtype != w.dtype:
            raise ModelError(f"{label(node)} has a {w.dtype} weight with a {w_zp.dtype} zero "
                             f"point; hwonnx reads int8 and uint8 weights")
        scale = np.broadcast_to(combined.reshape(-1) / x_scale, (channels,)).astype(np.float32)
        weight = self.dequantize_constant(node, node.input[1], scale, w_zp, 0 if conv else 1)
        self.consumed.update((cast.output[0], mul.output[0]))
        self.emit(node, "Conv" if conv else "MatMul", [x, weight], mul.output, drop=())

    def _sole_consumer(self, value: str) -> "onnx.NodeProto | None":
        readers = self.consumers.get(value, [])
        return readers[0] if len(readers) == 1 else None

