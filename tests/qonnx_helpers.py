"""What the QONNX tests share: a builder of QONNX graphs in Brevitas' style, qonnx's
reference executor, the golden model of a build, differences in output steps."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from qonnx.core.modelwrapper import ModelWrapper
from qonnx.core.onnx_exec import execute_onnx
from qonnx.transformation.infer_shapes import InferShapes

from hwonnx import api
from hwonnx.config import ArchConfig


F = TensorProto.FLOAT
QONNX = "qonnx.custom_op.general"
CHANNELS_LAST = "qonnx.custom_op.channels_last"
SAMPLES = 8
#: The onnxruntime-rounding 4x4 configuration of tests/end_to_end/test_rtl.py (cached Verilator
#: build): QONNX's ROUND is half to even, as onnxruntime's.
ORT_CONFIG = ArchConfig(rows=4, cols=4, act_depth=2048, wgt_depth=4096, acc_depth=16,
                        par_depth=64, prog_depth=2048, ort_rounding=True)


class Builder:
    """A QONNX graph written with onnx's helper API, Brevitas style: a ``Quant`` on every
    weight and activation, scales and bit widths as initializers."""

    def __init__(self, rng, domain: str = QONNX, pow2: bool = True):
        self.rng, self.domain, self.pow2 = rng, domain, pow2
        self.nodes, self.inits, self.shapes = [], {}, {}

    def const(self, name: str, value) -> str:
        self.inits[name] = np.asarray(value, np.float32)
        return name

    def scale(self, value):
        value = np.asarray(value, np.float64)
        if self.pow2:
            return (2.0 ** np.round(np.log2(value))).astype(np.float32)
        return value.astype(np.float32)

    def quant(self, x: str, out: str, scale, bits: int, signed=True, narrow=False,
              rounding="ROUND", zeropt=0.0) -> str:
        self.nodes.append(helper.make_node(
            "Quant", [x, self.const(f"{out}_s", scale), self.const(f"{out}_z", zeropt),
                      self.const(f"{out}_b", bits)], [out], domain=self.domain,
            signed=int(signed), narrow=int(narrow), rounding_mode=rounding, name=f"q_{out}"))
        return out

    def weight(self, name: str, shape, bits: int, per_channel=True, axis=0,
               rounding="ROUND") -> "tuple[str, np.ndarray]":
        """A He-normal weight and its quantizer (``BipolarQuant`` for 1 bit); returns the
        quantized weight's name and its scale (per output channel, or one)."""
        fan_in = int(np.prod(shape)) // shape[axis]
        w = self.rng.normal(0, (2 / fan_in) ** 0.5, shape).astype(np.float32)
        reduce = tuple(i for i in range(len(shape)) if i != axis)
        top = np.abs(w).max(axis=reduce) if per_channel else np.abs(w).max()
        if bits == 1:
            scale = self.scale(np.abs(w).mean(axis=reduce) if per_channel else np.abs(w).mean())
        else:
            scale = self.scale(top / (2 ** (bits - 1) - 1))
        shaped = scale.reshape([-1 if i == axis else 1 for i in range(len(shape))]) \
            if per_channel else scale
        self.const(f"{name}_float", w)
        if bits == 1:
            self.nodes.append(helper.make_node("BipolarQuant", [
                f"{name}_float", self.const(f"{name}_s", shaped)], [name],
                domain=self.domain, name=f"q_{name}"))
        else:
            self.quant(f"{name}_float", name, shaped, bits, narrow=True, rounding=rounding)
        return name, np.broadcast_to(scale, (shape[axis],)).astype(np.float32)

    def bias(self, name: str, channels: int, scale, quantized: bool) -> str:
        """A bias: Brevitas' Int32Bias (a 32-bit ``Quant`` with scale input x weight scale)
        or float."""
        b = self.rng.normal(0, 0.2, channels).astype(np.float32)
        if not quantized:
            return self.const(name, b)
        self.const(f"{name}_float", b)
        return self.quant(f"{name}_float", name, np.asarray(scale, np.float32), 32)

    def node(self, op: str, inputs, out: str, domain: str = "", **attrs) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, domain=domain,
                                           **attrs))
        return out

    def model(self, in_shape, out: str, out_shape, imports=(QONNX,)) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "qonnx_test", [helper.make_tensor_value_info("x", F, in_shape)],
            [helper.make_tensor_value_info(out, F, out_shape)],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()],
            value_info=[helper.make_tensor_value_info(k, F, s) for k, s in self.shapes.items()])
        return helper.make_model(graph, ir_version=8, opset_imports=[
            helper.make_opsetid("", 13),      # channels last 9: qonnx runs its BN at opset 9
            *(helper.make_opsetid(d, 9 if d == CHANNELS_LAST else 1) for d in imports)])


def reference(model: onnx.ModelProto, xs: np.ndarray) -> np.ndarray:
    """qonnx's executor, one sample at a time."""
    wrapper = ModelWrapper(model).transform(InferShapes())
    name, out = wrapper.graph.input[0].name, wrapper.graph.output[0].name
    return np.concatenate([execute_onnx(wrapper, {name: x[None]})[out] for x in xs])


def golden(model, xs, config=ORT_CONFIG, name="x"):
    result = api.build(model, None, calib=None, config=config, verilog=False,
                       log=lambda *_: None)
    return result, api.simulate(result, {name: xs}, mode="golden")


def steps(got: np.ndarray, want: np.ndarray, scale: float) -> np.ndarray:
    return np.rint((got.astype(np.float64) - want.astype(np.float64)) / scale).astype(int)


def conv_net(seed: int, wbits: int, abits: int, *, pow2=True, int_bias=True, per_channel=True,
             bn=False, signed_act=False, narrow_act=False, domain=QONNX) -> onnx.ModelProto:
    """x [1,3,8,8] -> Quant (8-bit signed) -> Conv 3x3 (wbits) [-> BatchNormalization] ->
    Relu (unless signed_act) -> Quant (abits) -> Conv 3x3 stride 2 (wbits) -> Relu -> Quant
    (abits, unsigned) -> Flatten -> Gemm (8-bit weights) -> Quant (8-bit signed)."""
    b = Builder(np.random.default_rng(seed), domain, pow2)
    s_x = b.scale(1 / 32 if pow2 else 0.0297)
    b.quant("x", "xq", s_x, 8)
    w1, s_w1 = b.weight("w1", (6, 3, 3, 3), wbits, per_channel)
    bias1 = b.bias("b1", 6, s_x * s_w1, int_bias and not bn)
    c1 = b.node("Conv", ["xq", w1, bias1], "c1", pads=[1, 1, 1, 1])
    if bn:
        g = b.rng.uniform(0.5, 1.5, 6) * np.where(np.arange(6) == 2, -1, 1)   # one negative
        c1 = b.node("BatchNormalization", [c1, b.const("bn_g", g), b.const(
            "bn_b", b.rng.normal(0, 0.1, 6)), b.const("bn_m", b.rng.normal(0, 0.1, 6)),
            b.const("bn_v", b.rng.uniform(0.5, 2, 6))], "n1")
    top = 2 ** (abits - 1) - 1 if signed_act else 2 ** abits - 1
    a1 = c1 if signed_act else b.node("Relu", [c1], "r1")
    s_a1 = b.scale(3.0 / max(top, 1))
    b.quant(a1, "a1q", s_a1, abits, signed=signed_act, narrow=narrow_act)
    w2, s_w2 = b.weight("w2", (8, 6, 3, 3), wbits, per_channel)
    bias2 = b.bias("b2", 8, s_a1 * s_w2, int_bias)
    c2 = b.node("Conv", ["a1q", w2, bias2], "c2", pads=[1, 1, 1, 1], strides=[2, 2])
    s_a2 = b.scale(3.0 / (2 ** abits - 1))
    b.quant(b.node("Relu", [c2], "r2"), "a2q", s_a2, abits, signed=False)
    f = b.node("Flatten", ["a2q"], "f")
    w3, s_w3 = b.weight("w3", (10, 8 * 4 * 4), 8, per_channel, axis=0)
    bias3 = b.bias("b3", 10, s_a2 * s_w3, int_bias)
    g3 = b.node("Gemm", [f, w3, bias3], "g", transB=1)
    b.quant(g3, "y", b.scale(0.05), 8)
    return b.model([1, 3, 8, 8], "y", [1, 10], imports=(domain,))
