"""QONNX models (Brevitas/QKeras exports): ``Quant``/``BipolarQuant`` read, mapped onto int8
weights and n-bit requantization ranges, compared with qonnx's own reference executor
(``qonnx.core.onnx_exec.execute_onnx`` on ``ModelWrapper(model)``): golden equal to it bit for
bit where the arithmetic is integer (power-of-two scales and quantized biases, so that qonnx's
float32 arithmetic is exact), within one output step otherwise (the differences printed); the
RTL equal to golden bit for bit in the predicted cycles."""

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import qonnx
from onnx import TensorProto, helper, numpy_helper
from qonnx.core.modelwrapper import ModelWrapper
from qonnx.core.onnx_exec import execute_onnx
from qonnx.transformation.infer_shapes import InferShapes

from hwonnx import api
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError
from hwonnx.frontend import load_model
from rtl_helpers import rtl_matches_golden

F = TensorProto.FLOAT
QONNX = "qonnx.custom_op.general"
CHANNELS_LAST = "qonnx.custom_op.channels_last"
SAMPLES = 8
#: The onnxruntime-rounding 4x4 configuration of tests/test_rtl.py (cached Verilator build):
#: QONNX's ROUND is half to even, as onnxruntime's.
ORT_CONFIG = ArchConfig(rows=4, cols=4, act_depth=2048, wgt_depth=4096, acc_depth=16,
                        par_depth=64, prog_depth=2048, ort_rounding=True)


def raises(cls, message):
    return pytest.raises(cls, match="^" + re.escape(message) + "$")


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


EXACT = {   # power-of-two scales and Int32 biases: qonnx's float32 arithmetic is exact
    "w8a8": dict(wbits=8, abits=8),
    "w4a4": dict(wbits=4, abits=4),
    "w2a2_per_tensor": dict(wbits=2, abits=2, per_channel=False),
    "w1a1": dict(wbits=1, abits=1),                   # BipolarQuant weights, binary activations
    "w3a5": dict(wbits=3, abits=5),
    "w6a3_signed_narrow": dict(wbits=6, abits=3, signed_act=True, narrow_act=True),
    "w5a4_signed": dict(wbits=5, abits=4, signed_act=True),
    "w8a7_narrow_unsigned": dict(wbits=8, abits=7, narrow_act=True),
    "w4a4_brevitas_domain": dict(wbits=4, abits=4, domain="onnx.brevitas"),
}


@pytest.mark.parametrize("case", sorted(EXACT))
def test_power_of_two_models_equal_qonnx_bit_for_bit(case):
    rng = np.random.default_rng(1)
    model = conv_net(3, **EXACT[case])
    xs = rng.normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    _, result = golden(model, xs)
    np.testing.assert_array_equal(result.outputs["y"], want)


INEXACT = {  # float biases, arbitrary scales, a BatchNormalization folded into the layer
    "w8a8_float_bias": dict(wbits=8, abits=8, int_bias=False),
    "w4a4_arbitrary": dict(wbits=4, abits=4, pow2=False),
    "w4a4_batchnorm": dict(wbits=4, abits=4, bn=True),
    "w8a8_arbitrary_batchnorm": dict(wbits=8, abits=8, pow2=False, bn=True, int_bias=False),
    "w2a3_arbitrary_per_tensor": dict(wbits=2, abits=3, pow2=False, per_channel=False),
}


@pytest.mark.parametrize("case", sorted(INEXACT))
def test_other_models_within_one_step_of_qonnx(case):
    rng = np.random.default_rng(2)
    model = conv_net(4, **INEXACT[case])
    xs = rng.normal(0, 1, (32, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    _, result = golden(model, xs)
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer
                                             if i.name == "y_s")))
    diff = steps(result.outputs["y"], want, scale)
    print(f"{case}: {np.count_nonzero(diff)} of {diff.size} outputs differ from qonnx's "
          f"executor, by at most {np.abs(diff).max()} step(s)")
    assert np.abs(diff).max() <= 1
    assert np.count_nonzero(diff) < diff.size // 10


def test_weights_are_the_models_integers():
    """The integer graph holds the quantizers' integers (4-bit, narrow: within [-7, 7], held
    as multiples of 2^k only where a float bias asks for a finer grid) and the activation
    quantizers' ranges as clamps."""
    model = conv_net(5, wbits=4, abits=3)
    result, _ = golden(model, np.zeros((1, 3, 8, 8), np.float32))
    layers = {n.name: n for n in result.graph.nodes if n.op in ("QConv", "QDense")}
    for name in ("c1", "c2"):
        w = result.graph.constants[layers[name].inputs[1]]
        assert w.min() >= -7 and w.max() <= 7 and len(np.unique(w)) > 4
    assert (layers["c1"].attrs["lo"], layers["c1"].attrs["hi"]) == (0, 7)   # 3-bit unsigned
    assert (layers["c2"].attrs["lo"], layers["c2"].attrs["hi"]) == (0, 7)
    assert (layers["g"].attrs["lo"], layers["g"].attrs["hi"]) == (-128, 127)
    assert layers["c1"].attrs["out_zp"] == 0 and layers["c1"].attrs["rounding"] == "ort"


def test_float_bias_widens_low_bit_weights():
    model = conv_net(5, wbits=4, abits=4, int_bias=False)
    result, _ = golden(model, np.zeros((1, 3, 8, 8), np.float32))
    w = result.graph.constants[next(n for n in result.graph.nodes if n.name == "c2").inputs[1]]
    assert np.all(w % 16 == 0) and np.abs(w).max() <= 112       # 4-bit narrow x 16
    assert any("multiples of 16" in note for note in result.graph.meta["notes"])


def test_missing_opset_import_is_read_with_a_warning():
    model = conv_net(6, wbits=8, abits=8)
    del model.opset_import[1:]
    graph = load_model(model)
    assert any(w.startswith("Node 'q_xq' uses Quant of domain 'qonnx.custom_op.general', "
                            "which the model's opset_import does not import: the file is not "
                            "valid ONNX IR as it stands") for w in graph.meta["warnings"])
    model.graph.node[0].domain = "my.custom.domain"
    with pytest.raises(ModelError, match="domain 'my.custom.domain', which the model's "
                                         "opset_import does not import"):
        load_model(model)


def test_finn_domain_is_read_as_qonnx():
    """FINN's domain name for the same operators: equal to the qonnx-domain model."""
    rng = np.random.default_rng(7)
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    want = reference(conv_net(8, 4, 4), xs)
    _, result = golden(conv_net(8, 4, 4, domain="finn.custom_op.general"), xs)
    np.testing.assert_array_equal(result.outputs["y"], want)


@pytest.mark.parametrize("attr, message", [
    ("narrow", "Quant 'q_xq' has no attribute 'narrow'; qonnx's reference executor requires "
               "it (its documentation gives a default, its code none): set it explicitly"),
    ("signed", "Quant 'q_xq' has no attribute 'signed'; qonnx's reference executor requires "
               "it (its documentation gives a default, its code none): set it explicitly"),
])
def test_missing_signed_or_narrow_is_refused(attr, message):
    model = conv_net(9, 8, 8)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != attr]
    del node.attribute[:]
    node.attribute.extend(kept)
    with raises(ModelError, message):
        load_model(model)


def test_refused_by_name():
    model = conv_net(10, 8, 8)
    model.graph.node[0].op_type = "FloatQuant"
    with raises(ModelError, "FloatQuant 'q_xq' is a floating-point (minifloat, fp8) quantizer; "
                            "hwonnx's arithmetic is integer: FloatQuant is not supported"):
        load_model(model)
    model = conv_net(10, 8, 8)
    for a in model.graph.node[0].attribute:
        if a.name == "rounding_mode":
            a.s = b"FLOOR"
    with raises(ModelError, "Quant 'q_xq' rounds the run-time tensor 'x' with rounding_mode "
                            "FLOOR; hwonnx requantizes activations with ROUND (half to even)"):
        load_model(model)
    model = conv_net(10, 8, 8)
    model.graph.node[0].op_type = "BipolarQuant"
    del model.graph.node[0].input[2:]
    del model.graph.node[0].attribute[:]
    with raises(ModelError, "BipolarQuant 'q_xq' quantizes the run-time tensor 'x' to ±1, but "
                            "no Conv or Gemm with quantized weights and a quantized input "
                            "writes it alone; hwonnx maps a bipolar activation as the sign of "
                            "such a layer"):
        load_model(model)


def test_weight_rounding_modes_follow_qonnx():
    """A weight quantizer's rounding mode (here FLOOR, CEIL, HALF_UP) is applied on the host,
    exactly as qonnx's executor applies it."""
    rng = np.random.default_rng(11)
    xs = rng.normal(0, 1, (4, 16)).astype(np.float32)
    for rounding in ("FLOOR", "CEIL", "HALF_UP", "DOWN"):
        b = Builder(np.random.default_rng(12))
        b.quant("x", "xq", 1 / 16, 8)
        w, s_w = b.weight("w", (10, 16), 5, rounding=rounding)
        bias = b.bias("b", 10, np.float32(1 / 16) * s_w, True)
        b.quant(b.node("Gemm", ["xq", w, bias], "g", transB=1), "y", 1 / 8, 8)
        model = b.model([1, 16], "y", [1, 10])
        _, result = golden(model, xs)
        np.testing.assert_array_equal(result.outputs["y"], reference(model, xs))


def channels_last_net(seed: int) -> onnx.ModelProto:
    """x NCHW -> Transpose -> Quant -> channels-last Conv (4-bit weights) -> channels-last
    BatchNormalization -> Relu -> Quant (4-bit) -> channels-last MaxPool -> Transpose ->
    Flatten -> Gemm -> Quant: as qonnx's ConvertToChannelsLastAndClean writes it."""
    b = Builder(np.random.default_rng(seed))
    b.node("Transpose", ["x"], "xt", perm=[0, 2, 3, 1])
    b.quant("xt", "xq", 1 / 32, 8)
    w, s_w = b.weight("w", (6, 3, 3, 3), 4)            # [M, KH, KW, C]
    b.node("Conv", ["xq", w, b.bias("b", 6, np.float32(1 / 32) * s_w, True)], "c",
           domain=CHANNELS_LAST, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
           dilations=[1, 1], group=1)
    b.node("BatchNormalization", ["c", b.const("bn_g", b.rng.uniform(0.5, 1.5, 6)),
                                  b.const("bn_b", b.rng.normal(0, .1, 6)),
                                  b.const("bn_m", b.rng.normal(0, .1, 6)),
                                  b.const("bn_v", b.rng.uniform(.5, 2, 6))], "n",
           domain=CHANNELS_LAST, epsilon=1e-5)
    b.quant(b.node("Relu", ["n"], "r"), "a", 0.25, 4, signed=False)
    b.node("MaxPool", ["a"], "p", domain=CHANNELS_LAST, kernel_shape=[2, 2], strides=[2, 2],
           pads=[0, 0, 0, 0])
    b.node("Transpose", ["p"], "pt", perm=[0, 3, 1, 2])
    w2, s_w2 = b.weight("w2", (10, 6 * 4 * 4), 8)
    g = b.node("Gemm", [b.node("Flatten", ["pt"], "f"), w2,
                        b.bias("b2", 10, np.float32(0.25) * s_w2, True)], "g", transB=1)
    b.quant(g, "y", 1 / 16, 8)
    b.shapes.update(w=[6, 3, 3, 3], xt=[1, 8, 8, 3], xq=[1, 8, 8, 3], c=[1, 8, 8, 6], n=[1, 8, 8, 6],
                    r=[1, 8, 8, 6], a=[1, 8, 8, 6], p=[1, 4, 4, 6])
    return b.model([1, 3, 8, 8], "y", [1, 10], imports=(QONNX, CHANNELS_LAST))


def test_channels_last_ops_are_their_nchw_twins():
    rng = np.random.default_rng(13)
    model = channels_last_net(14)
    xs = rng.normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    result, golden_result = golden(model, xs)
    diff = steps(golden_result.outputs["y"], want, 1 / 16)
    print(f"channels last: {np.count_nonzero(diff)} of {diff.size} outputs differ, at most "
          f"{np.abs(diff).max()} step(s) (the BatchNormalization folded, its bias rounded)")
    assert np.abs(diff).max() <= 1
    assert not any(n.op in ("Permute", "QPermute") for n in result.graph.nodes)


def test_inspect_shows_quantizers():
    from hwonnx.inspect import format_inspection
    text = format_inspection(load_model(conv_net(15, 4, 3, pow2=False)), "m.onnx")
    assert "Quantizers (bits, signedness, scale):" in text
    assert "  c1: weights 4-bit signed narrow, arbitrary per channel scale (q_w1)" in text
    assert "  c1: output 3-bit unsigned, arbitrary per tensor scale (q_a1q)" in text
    assert "  c1: bias 32-bit signed, arbitrary per channel scale (q_b1)" in text


def test_inspect_places_a_prequantized_model_on_an_array_without_the_rounding_unit():
    """``hwonnx inspect`` plans the model as ``build`` does: layers that would round as
    onnxruntime does round half up on the default array (before, the placement failed)."""
    from hwonnx.inspect import format_placement
    text = format_placement(load_model(conv_net(15, 4, 3)), ArchConfig())
    assert "| c1 | QConv | hardware |" in text and "| g | QDense | hardware |" in text


@pytest.mark.rtl
@pytest.mark.parametrize("case", ["w4a4", "w1a1", "w6a3_signed_narrow"])
def test_rtl_equals_golden(case):
    rng = np.random.default_rng(16)
    model = conv_net(3, **EXACT[case])
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


# -- the models the qonnx wheel ships ------------------------------------------------------

DATA = Path(qonnx.__file__).parent / "data" / "onnx"
#: ESPCN on an 8x8 crop of its test image needs deeper buffers than ORT_CONFIG.
ESPCN_CONFIG = ArchConfig(rows=4, cols=4, act_depth=8192, wgt_depth=16384, acc_depth=16,
                          par_depth=256, prog_depth=8192, ort_rounding=True)


def cropped(path: Path, size: int, factor: int = 1) -> onnx.ModelProto:
    """The model at ``path`` with its input's height and width set to ``size`` (and its
    output's to ``factor * size``): the convolutions and weights are the model's own, the
    image a crop, so that the RTL runs in seconds."""
    model = onnx.load(path)
    for value, n in ((model.graph.input[0], size), (model.graph.output[0], factor * size)):
        for dim in value.type.tensor_type.shape.dim[2:]:
            dim.dim_value = n
    del model.graph.value_info[:]
    return model


def value_params(graph) -> dict:
    """Integer value -> (scale, zero point) from the nodes that write them."""
    params = {}
    for node in graph.nodes:
        if node.op == "Quantize":
            params[node.outputs[0]] = (node.attrs["scale"], node.attrs["zero_point"])
        elif "out_scale" in node.attrs:
            params[node.outputs[0]] = (node.attrs["out_scale"], node.attrs["out_zp"])
    return params


def per_layer_steps(graph, context: dict, names: dict) -> dict:
    """Each accelerator layer run by the golden model on the reference's input (quantized
    with the layer's input parameters: exact, the reference's tensor is on that grid),
    against the reference's output (quantized with the layer's output parameters and clamp,
    where the reference leaves it float before a ReLU and a quantizer): layer -> differences
    in output steps."""
    from hwonnx.golden.ops import GOLDEN_OPS

    params, result = value_params(graph), {}
    for node in graph.nodes:
        x, y = node.inputs[0], node.outputs[0]
        if node.op not in GOLDEN_OPS or x not in names or y not in names or y not in params:
            continue
        (s_x, z_x), (s_y, z_y) = params[x], params[y]
        q_x = np.rint(context[names[x]] / s_x).astype(np.int64) + z_x
        if np.abs((q_x - z_x) * s_x - context[names[x]]).max() > 1e-4 * s_x:
            continue                 # the reference's input is not on the layer's input grid
        args = [q_x.astype(np.int8)] + [graph.constants[v] for v in node.inputs[1:]]
        got = GOLDEN_OPS[node.op](*args, **dict(node.attrs)).astype(np.int64)
        want = np.clip(np.rint(context[names[y]] / s_y).astype(np.int64) + z_y,
                       node.attrs.get("lo", -128), node.attrs.get("hi", 127))
        result[node.name] = got.reshape(want.shape) - want
    return result


def test_espcn_nn_resize_shipped_model():
    """Brevitas' ESPCN (8-bit input and output, 4-bit hidden activations and weights, per
    channel, float biases, BatchNormalization between each Conv and its quantizer, nearest
    Resize), on an 8x8 crop of its test image: every layer within one step of qonnx's
    executor given the same input; end to end the differences compound (4-bit inputs to an
    8-bit layer turn one step into several of the finer output), reported; the RTL equal to
    golden in the predicted cycles."""
    model = cropped(DATA / "bsd300x3-espcn" / "nn_resize" / "quant_model.onnx", 8, 2)
    image = numpy_helper.to_array(onnx.load_tensor(
        str(DATA / "bsd300x3-espcn" / "test_data" / "input_0.pb")))
    xs = np.stack([image[0, :, :8, :8], image[0, :, 40:48, 60:68]])
    wrapper = ModelWrapper(model).transform(InferShapes())
    name = wrapper.graph.input[0].name
    contexts = [execute_onnx(wrapper, {name: x[None]}, return_full_exec_context=True)
                for x in xs]
    want = np.concatenate([c["96"] for c in contexts])
    result = api.build(model, None, calib=None, config=ESPCN_CONFIG, verilog=False,
                       log=lambda *_: None)
    names = {"onnx::Relu_0:q": "x", "input.3:q": "x.7", "input.11:q": "x.15",
             "input.19:q": "onnx::Resize_80", "x.23:q": "x.23", "96:q": "96"}
    for context in contexts:
        layers = per_layer_steps(result.graph, context, names)
        assert sorted(layers) == ["Conv_10", "Conv_22", "Conv_34", "Conv_48", "Resize_42"]
        for layer, diff in layers.items():
            print(f"{layer}: {np.count_nonzero(diff)} of {diff.size} differ from qonnx given "
                  f"its input, at most {np.abs(diff).max()} step")
            assert np.abs(diff).max() <= 1
    # (not rtl_matches_golden: its layer-by-layer check truncates the program after the
    # first output phase of the Resize, whose other phases have not yet written their pixels)
    rtl = api.simulate(result, {name: xs}, mode="compare", log=lambda *_: None)
    np.testing.assert_array_equal(rtl.int_outputs, api.simulate(
        result, {name: xs}, mode="golden").int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * len(xs)
    diff = steps(rtl.outputs["96"], want, 0.003921568859368563)
    print(f"ESPCN end to end: {np.count_nonzero(diff)} of {diff.size} outputs differ from "
          f"qonnx's executor, at most {np.abs(diff).max()} steps")
    assert np.abs(diff).max() <= 3


def _shipped(rel: str, size: "int | None"):
    model = onnx.load(DATA / rel) if size is None else cropped(DATA / rel, size)
    if size is not None:                          # the output's size: inferred from the crop
        for dim in model.graph.output[0].type.tensor_type.shape.dim[2:]:
            dim.dim_param = "s"
    return model


@pytest.mark.rtl
def test_eltwise_chanlast_testcase_shipped_model():
    """A float Conv with folded scale and bias, ReLU, a per-channel Mul and an unsigned
    4-bit Quant (scale 1) whose domain the model does not import; the input is annotated
    UINT8. Calibrated on integer images (the input quantization is then exact, scale 1):
    within one output step of qonnx's executor; RTL equal to golden."""
    model = _shipped("eltwise_chanlast_testcase.onnx", 16)
    rng = np.random.default_rng(17)
    xs = rng.integers(0, 256, (16, 3, 16, 16)).astype(np.float32)
    result = api.build(model, None, calib={"global_in": xs}, config=ORT_CONFIG,
                       verilog=False, log=lambda *_: None)
    assert any("'qonnx.custom_op.general', which the model's opset_import does not import"
               in w for w in result.graph.meta["warnings"])
    layer = next(n for n in result.graph.nodes if n.name == "Mul_30")
    assert (layer.attrs["lo"], layer.attrs["hi"]) == (0, 15)
    rtl = rtl_matches_golden(result, {"global_in": xs[:4]}, 4)
    want = reference(model, xs[:4])
    diff = steps(rtl.outputs["Mul_31_out0"], want, 1.0)
    print(f"eltwise_chanlast: {np.count_nonzero(diff)} of {diff.size} outputs differ from "
          f"qonnx's executor (the float Conv is calibrated), at most {np.abs(diff).max()}")
    assert np.abs(diff).max() <= 1 and want.max() == 15


@pytest.mark.rtl
@pytest.mark.parametrize("rel, size", [("mnist-conv/model.onnx", None),
                                       ("residual_block_clean.onnx", 40)])
def test_float_shipped_models(rel, size):
    """The wheel's float models (mnist-conv: Conv/Add bias/Relu/MaxPool/MatMul with its
    parameters as graph inputs, IR 3; residual_block_clean: strided Conv, residual Add,
    MaxPool, on a 40x40 crop), quantized by hwonnx with calibration: the RTL equal to golden;
    golden against qonnx's executor within the calibrated quantization's error (reported)."""
    model = _shipped(rel, size)
    rng = np.random.default_rng(18)
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if rel.startswith("mnist"):
        image = numpy_helper.to_array(onnx.load_tensor(
            str(DATA / "mnist-conv" / "test_data_set_0" / "input_0.pb")))
        xs = np.clip(image + rng.normal(0, 30, (16, *shape[1:])), 0, 255).astype(np.float32)
        xs[0] = image[0]
    else:
        xs = rng.uniform(0, 1, (16, *shape[1:])).astype(np.float32)
    result = api.build(model, None, calib={name: xs}, config=ArchConfig(), verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {name: xs[:4]}, 4)
    want = reference(model, xs[:4])
    got = list(rtl.outputs.values())[0].reshape(want.shape)
    error = float(np.abs(got - want).max() / np.ptp(want))
    print(f"{rel}: largest difference from qonnx's executor {error:.1%} of the output range")
    assert error < 0.06
    if rel.startswith("mnist"):
        expected = numpy_helper.to_array(onnx.load_tensor(
            str(DATA / "mnist-conv" / "test_data_set_0" / "output_0.pb")))
        assert got[0].argmax() == expected.argmax()


def trunc_net(seed: int, rounding: str, v2: bool, pool: bool = True) -> onnx.ModelProto:
    """x -> Quant -> Conv (4-bit weights) -> Relu -> Quant (4-bit unsigned, 1/4) ->
    [AveragePool 2x2 -> Mul 4 (Brevitas' TruncAvgPool2d: the window's sum)] -> Trunc (6 to 4
    bits, or 4 to 2 without the pool) -> Flatten -> Gemm -> Quant."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", 1 / 32, 8)
    w, s_w = b.weight("w", (4, 3, 3, 3), 4)
    c = b.node("Conv", ["xq", w, b.bias("b", 4, np.float32(1 / 32) * s_w, True)], "c",
               pads=[1, 1, 1, 1])
    b.quant(b.node("Relu", [c], "r"), "a", 0.25, 4, signed=False)
    source, in_bits, size = "a", 4, 8
    if pool:
        p = b.node("AveragePool", ["a"], "p", kernel_shape=[2, 2], strides=[2, 2])
        source, in_bits, size = b.node("Mul", [p, b.const("four", 4.0)], "m"), 6, 4
    out_bits = in_bits - 2
    inputs = [source, b.const("t_s", 0.25), b.const("t_z", 0.0), b.const("t_ib", in_bits)]
    if v2:
        inputs += [b.const("t_os", 1.0), b.const("t_ob", out_bits)]
        b.nodes.append(helper.make_node("Trunc", inputs, ["t"], domain=QONNX, name="trunc",
                                        rounding_mode=rounding, signed=0, narrow=0))
    else:
        inputs.append(b.const("t_ob", out_bits))
        b.nodes.append(helper.make_node("Trunc", inputs, ["t"], domain=QONNX, name="trunc",
                                        rounding_mode=rounding))
    w2, s_w2 = b.weight("w2", (10, 4 * size * size), 8)
    t_scale = np.float32(1.0 if v2 else 0.25)
    g = b.node("Gemm", [b.node("Flatten", ["t"], "f"), w2, b.bias("b2", 10, t_scale * s_w2,
                                                                     True)], "g", transB=1)
    b.quant(g, "y", 1 / 8, 8)
    model = b.model([1, 3, 8, 8], "y", [1, 10])
    model.opset_import[1].version = 2 if v2 else 1
    return model


@pytest.mark.parametrize("rounding", ["FLOOR", "CEIL", "ROUND"])
@pytest.mark.parametrize("v2", [False, True], ids=["trunc_v1", "trunc_v2"])
@pytest.mark.parametrize("pool", [True, False], ids=["avgpool", "shift"])
def test_trunc_equals_qonnx_bit_for_bit(rounding, v2, pool):
    """Trunc as a depthwise sum requantized by exactly 2^-k with its rounding mode."""
    rng = np.random.default_rng(19)
    model = trunc_net(20, rounding, v2, pool)
    xs = rng.normal(0, 1, (SAMPLES, 3, 8, 8)).astype(np.float32)
    want = reference(model, xs)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], want)
    layer = next(n for n in result.graph.nodes if n.name == "trunc")
    assert layer.attrs.get("rounding") == ("ort" if rounding == "ROUND" else None)
    if v2:
        assert (layer.attrs["lo"], layer.attrs["hi"]) == (0, 2 ** (2 if pool else 0) * 4 - 1)


@pytest.mark.rtl
@pytest.mark.parametrize("rounding, v2", [("FLOOR", False), ("CEIL", True)])
def test_trunc_rtl_equals_golden(rounding, v2):
    rng = np.random.default_rng(21)
    model = trunc_net(22, rounding, v2)
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def test_espcn_subpixel_shipped_model():
    """ESPCN with DepthToSpace (pixel shuffle, a copy on the array) and no input quantizer
    (the input is calibrated: on a ramp of k/255, the test image's grid, so its quantization
    is exact): every layer within one step of qonnx given its input; end to end reported."""
    model = cropped(DATA / "bsd300x3-espcn" / "subpixel" / "quant_model.onnx", 8, 2)
    image = numpy_helper.to_array(onnx.load_tensor(
        str(DATA / "bsd300x3-espcn" / "test_data" / "input_0.pb")))
    xs = np.stack([image[0, :, :8, :8], image[0, :, 40:48, 60:68]])
    name = model.graph.input[0].name
    wrapper = ModelWrapper(model).transform(InferShapes())
    contexts = [execute_onnx(wrapper, {name: x[None]}, return_full_exec_context=True)
                for x in xs]
    want = np.concatenate([c["79"] for c in contexts])
    ramp = (np.arange(3 * 8 * 8) % 256).reshape(1, 3, 8, 8).astype(np.float32) / 255
    ramp.flat[-1] = 1.0
    result = api.build(model, None, calib={name: np.concatenate([xs, ramp])},
                       config=ESPCN_CONFIG, verilog=False, log=lambda *_: None)
    assert [n.op for n in result.graph.nodes].count("QConvTranspose") == 1   # DepthToSpace
    names = {"x.7:q": "x.7", "input.3:q": "x.3", "input.11:q": "x.12", "input.19:q": "x.20",
             "onnx::DepthToSpace_73:q": "onnx::DepthToSpace_73", "79:q": "79"}
    seen = set()
    for context in contexts:
        for layer, diff in per_layer_steps(result.graph, context, names).items():
            seen.add(layer)
            print(f"{layer}: {np.count_nonzero(diff)} of {diff.size} differ from qonnx given "
                  f"its input, at most {np.abs(diff).max()} step")
            assert np.abs(diff).max() <= 1
    assert seen == {"Conv_5", "Conv_17", "Conv_29", "Conv_41"}
    rtl = api.simulate(result, {name: xs}, mode="compare", log=lambda *_: None)
    assert rtl.cycles == [rtl.predicted_cycles] * len(xs)
    diff = steps(rtl.outputs["79"], want, 0.003921568859368563)
    print(f"ESPCN subpixel end to end: {np.count_nonzero(diff)} of {diff.size} outputs differ "
          f"from qonnx's executor, at most {np.abs(diff).max()} steps")
    assert np.abs(diff).max() <= 8


def depth_to_space_net(seed: int, mode: str) -> onnx.ModelProto:
    """x -> Quant -> Conv (8 = 2 x 2 x 2 channels) -> Quant (8-bit signed) -> DepthToSpace
    (blocksize 2) -> Relu -> Quant -> Flatten -> Gemm -> Quant, power-of-two scales."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", 1 / 32, 8)
    w, s_w = b.weight("w", (8, 3, 3, 3), 6)
    b.quant(b.node("Conv", ["xq", w, b.bias("b", 8, np.float32(1 / 32) * s_w, True)], "c",
                   pads=[1, 1, 1, 1]), "cq", 1 / 8, 8)
    d = b.node("DepthToSpace", ["cq"], "d", blocksize=2, mode=mode)
    b.quant(b.node("Relu", [d], "r"), "a", 1 / 8, 8, signed=False)
    w2, s_w2 = b.weight("w2", (10, 2 * 8 * 8), 8)
    g = b.node("Gemm", [b.node("Flatten", ["a"], "f"), w2,
                        b.bias("b2", 10, np.float32(1 / 8) * s_w2, True)], "g", transB=1)
    b.quant(g, "y", 1 / 4, 8)
    return b.model([1, 3, 4, 4], "y", [1, 10])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_is_an_exact_copy(mode):
    rng = np.random.default_rng(23)
    model = depth_to_space_net(24, mode)
    xs = rng.normal(0, 1, (SAMPLES, 3, 4, 4)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    layer = next(n for n in result.graph.nodes if n.name == "d")
    assert layer.op == "QConvTranspose" and layer.attrs["group"] == (2 if mode == "CRD" else 1)


@pytest.mark.rtl
def test_depth_to_space_rtl_equals_golden():
    rng = np.random.default_rng(25)
    model = depth_to_space_net(26, "CRD")
    xs = rng.normal(0, 1, (4, 3, 4, 4)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = api.simulate(result, {"x": xs}, mode="compare", log=lambda *_: None)
    assert rtl.cycles == [rtl.predicted_cycles] * 4
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))


def bipolar_net(seed: int, one_bit_quant: bool = False) -> onnx.ModelProto:
    """FINN's W1A1 style: x -> Quant (8-bit) -> Conv (bipolar weights) -> BatchNormalization
    -> BipolarQuant -> Conv (bipolar weights, float bias) -> BipolarQuant (or Brevitas' 1-bit
    signed Quant) -> Flatten -> Gemm (4-bit weights) -> Quant."""
    b = Builder(np.random.default_rng(seed))
    b.quant("x", "xq", 1 / 16, 8)
    w1, _ = b.weight("w1", (8, 3, 3, 3), 1)
    c1 = b.node("Conv", ["xq", w1], "c1", pads=[1, 1, 1, 1])
    n1 = b.node("BatchNormalization", [c1, b.const("bn_g", b.rng.uniform(0.5, 1.5, 8) * np.where(
        np.arange(8) == 3, -1, 1)), b.const("bn_b", b.rng.normal(0, 0.3, 8)),
        b.const("bn_m", b.rng.normal(0, 0.3, 8)), b.const("bn_v", b.rng.uniform(0.5, 2, 8))],
        "n1")
    b.nodes.append(helper.make_node("BipolarQuant", [n1, b.const("a1_s", 1.0)], ["a1"],
                                    domain=QONNX, name="q_a1"))
    w2, _ = b.weight("w2", (8, 8, 3, 3), 1)
    c2 = b.node("Conv", ["a1", w2, b.const("b2", b.rng.normal(0, 2, 8))], "c2",
                pads=[1, 1, 1, 1], strides=[2, 2])
    if one_bit_quant:
        b.quant(c2, "a2", 0.5, 1)
    else:
        b.nodes.append(helper.make_node("BipolarQuant", [c2, b.const("a2_s", 0.5)], ["a2"],
                                        domain=QONNX, name="q_a2"))
    w3, s_w3 = b.weight("w3", (10, 8 * 4 * 4), 4)
    g = b.node("Gemm", [b.node("Flatten", ["a2"], "f"), w3,
                        b.bias("b3", 10, np.float32(0.5) * s_w3, True)], "g", transB=1)
    b.quant(g, "y", 1 / 4, 8)
    return b.model([1, 3, 8, 8], "y", [1, 10])


@pytest.mark.parametrize("one_bit_quant", [False, True], ids=["BipolarQuant", "Quant1bit"])
def test_bipolar_activations_equal_qonnx_bit_for_bit(one_bit_quant):
    """A bipolar activation is the sign of its layer, computed exactly as an odd integer
    threshold (the float bias and a folded BatchNormalization included)."""
    rng = np.random.default_rng(27)
    model = bipolar_net(28, one_bit_quant)
    xs = rng.normal(0, 1, (32, 3, 8, 8)).astype(np.float32)
    result, golden_result = golden(model, xs)
    np.testing.assert_array_equal(golden_result.outputs["y"], reference(model, xs))
    layers = {n.name: n for n in result.graph.nodes}
    for name in ("c1", "c2"):
        assert (layers[name].attrs["lo"], layers[name].attrs["hi"]) == (-1, 1)
        assert set(np.unique(result.graph.constants[layers[name].inputs[1]])) == {-2, 2}


@pytest.mark.rtl
def test_bipolar_rtl_equals_golden():
    rng = np.random.default_rng(29)
    model = bipolar_net(30)
    xs = rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    result = api.build(model, None, calib=None, config=ORT_CONFIG, verilog=False,
                       log=lambda *_: None)
    rtl = rtl_matches_golden(result, {"x": xs}, 4)
    np.testing.assert_array_equal(rtl.outputs["y"], reference(model, xs))
