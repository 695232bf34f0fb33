"""ConvTranspose, Resize and Upsample (issue 13, "Upsampling and slicing"): the float op
against onnxruntime's reference path, the integer op against the QDQ model's reference path and
against an exact NumPy repeat, the phase decomposition on the RTL (bit-exact, cycles =
prediction), and the refusals, each naming its node."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build, simulate
from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_session
from spec_helpers import make_model

RNG = np.random.default_rng(31)

#: kernel, stride, pad, output_padding, group (U-Net decoders: k2 s2; k3 s2 p1 op1; ...)
TRANSPOSED = [(2, 2, 0, 0, 1), (3, 2, 1, 1, 1), (3, 2, 0, 0, 2), (4, 2, 1, 0, 1),
              (1, 3, 0, 0, 1), (3, 1, 1, 0, 1), (2, 3, 0, 2, 1)]


def transposed_model(k, s, p, op, g, cin=4, cout=6, size=5):
    w = RNG.normal(0, 0.3, (cin, cout // g, k, k)).astype(np.float32)
    b = RNG.normal(0, 0.3, (cout,)).astype(np.float32)
    out = s * (size - 1) + op + k - 2 * p
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[s, s],
                            pads=[p, p, p, p], output_padding=[op, op], group=g, name="ct")
    return make_model([node], {"x": [1, cin, size, size]}, {"y": [1, cout, out, out]},
                      {"w": w, "b": b}, opset=17)


def _reference(model, x):
    session = reference_session(model)
    return np.concatenate([session.run(None, {"x": sample[None]})[0] for sample in x])


@pytest.mark.parametrize("k, s, p, op, g", TRANSPOSED)
def test_float_conv_transpose_equals_onnxruntime(k, s, p, op, g):
    model = transposed_model(k, s, p, op, g)
    x = RNG.normal(0, 1, (3, 4, 5, 5)).astype(np.float32)
    got = evaluate_float(load_model(model), {"x": x})["y"]
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)


def resize_model(scales, mode="half_pixel", nearest="round_prefer_floor", shape=(1, 3, 4, 5),
                 resize="nearest", opset=13):
    out = [int(d * s) for d, s in zip(shape, scales)]
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], mode=resize,
                            coordinate_transformation_mode=mode, nearest_mode=nearest,
                            name="up")
    return make_model([node], {"x": list(shape)}, {"y": out},
                      {"sc": np.asarray(scales, np.float32)}, opset=opset)


@pytest.mark.parametrize("mode, nearest", [
    ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
    ("pytorch_half_pixel", "round_prefer_floor"), ("asymmetric", "floor"),
    ("half_pixel_symmetric", "round_prefer_floor"), ("tf_half_pixel_for_nn", "floor")])
def test_nearest_resize_modes_that_repeat_pixels(mode, nearest):
    model = resize_model([1, 1, 2, 3], mode, nearest, opset=19)
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["ConvTranspose"]
    x = RNG.normal(0, 1, (2, 3, 4, 5)).astype(np.float32)
    want = _reference(model, x)
    np.testing.assert_array_equal(want, x.repeat(2, axis=2).repeat(3, axis=3))
    np.testing.assert_array_equal(evaluate_float(graph, {"x": x})["y"], want)


def test_upsample_nearest_of_opset_9():
    node = helper.make_node("Upsample", ["x", "sc"], ["y"], mode="nearest", name="up")
    model = make_model([node], {"x": [1, 2, 3, 3]}, {"y": [1, 2, 6, 6]},
                       {"sc": np.array([1, 1, 2, 2], np.float32)}, opset=9)
    x = RNG.normal(0, 1, (2, 2, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(evaluate_float(load_model(model), {"x": x})["y"],
                                  x.repeat(2, axis=2).repeat(2, axis=3))


def test_resizes_that_do_not_repeat_pixels_are_refused_in_one_error():
    w = RNG.normal(0, 0.3, (3, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Resize", ["x", "", "s1"], ["a"], mode="linear", name="bilinear"),
             helper.make_node("Resize", ["a", "", "s2"], ["b"], mode="nearest",
                              coordinate_transformation_mode="align_corners", name="corners"),
             helper.make_node("Resize", ["b", "", "s3"], ["c"], mode="nearest", name="down"),
             helper.make_node("ConvTranspose", ["c", "w"], ["y"], dilations=[2, 2],
                              name="dilated")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 3, 16, 16]},
                       {"s1": np.array([1, 1, 2, 2], np.float32),
                        "s2": np.array([1, 1, 3, 3], np.float32),
                        "s3": np.array([1, 1, 0.5, 0.5], np.float32), "w": w}, opset=13)
    with pytest.raises(UnsupportedOperatorError) as info:
        load_model(model)
    assert [n[0] for n in info.value.nodes] == ["bilinear", "corners", "down", "dilated"]
    message = str(info.value)
    assert "Resize 'bilinear' has mode 'linear'" in message
    assert "Resize 'corners' with coordinate_transformation_mode 'align_corners'" in message
    assert "Resize 'down' resizes [1, 3, 24, 24] to [1, 3, 12, 12]" in message
    assert "ConvTranspose 'dilated' has dilations [2, 2]" in message


def _q(name, value, dtype=np.int8):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def qdq_transposed(k, s, p, op):
    """x -> Q/DQ -> ConvTranspose (int8 weights, int32 bias) -> Q/DQ -> y, every scale and
    zero point given: hwonnx takes them all from the model."""
    s_x, s_w, s_y, z_y = 0.02, 0.01, 0.03, -5
    w = RNG.integers(-60, 61, (4, 6, k, k))
    bias = RNG.integers(-3000, 3001, 6)
    size = 5
    out = s * (size - 1) + op + k - 2 * p
    inits = [_q("w", w), _q("b", bias, np.int32),
             numpy_helper.from_array(np.float32(s_x), "s_x"), _q("z_x", 0),
             numpy_helper.from_array(np.float32(s_w), "s_w"), _q("z_w", 0),
             numpy_helper.from_array(np.float32(s_x * s_w), "s_b"), _q("z_b", 0, np.int32),
             numpy_helper.from_array(np.float32(s_y), "s_y"), _q("z_y", z_y)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["wd"], name="dqw"),
             helper.make_node("DequantizeLinear", ["b", "s_b", "z_b"], ["bd"], name="dqb"),
             helper.make_node("ConvTranspose", ["xd", "wd", "bd"], ["c"], strides=[s, s],
                              pads=[p, p, p, p], output_padding=[op, op], name="ct"),
             helper.make_node("QuantizeLinear", ["c", "s_y", "z_y"], ["yq"], name="qy"),
             helper.make_node("DequantizeLinear", ["yq", "s_y", "z_y"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, size, size])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 6, out, out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model, s_y


@pytest.mark.parametrize("k, s, p, op", [(2, 2, 0, 0), (3, 2, 1, 1), (3, 3, 1, 0)])
def test_integer_conv_transpose_within_one_lsb_of_the_qdq_reference(k, s, p, op):
    """The golden int8 output against onnxruntime's reference path (float ConvTranspose on
    the dequantized integers, QuantizeLinear): the same sums, requantized by a 31-bit
    multiplier instead of a float32 product, so at most 1 LSB apart, and rarely."""
    model, s_y = qdq_transposed(k, s, p, op)
    result = build(model, None, calib=None, verilog=False, log=lambda m: None)
    x = RNG.normal(0, 1.5, (8, 1, 4, 5, 5)).astype(np.float32)
    got = simulate(result, {"x": x}, mode="golden").outputs["y"]
    want = _reference(model, x[:, 0])
    lsb = np.rint(np.abs(got.reshape(want.shape) - want) / s_y).astype(int)
    print(f"\nConvTranspose k{k} s{s} p{p} op{op}: {np.count_nonzero(lsb)} of {lsb.size} "
          f"outputs differ from onnxruntime's reference path, max {lsb.max()} LSB")
    assert lsb.max() <= 1
    assert np.count_nonzero(lsb) <= 0.02 * lsb.size


def test_integer_nearest_upsampling_repeats_each_int8_value_exactly():
    model = resize_model([1, 1, 3, 2], shape=(1, 3, 4, 5))
    calib = RNG.normal(0, 1, (8, 1, 3, 4, 5)).astype(np.float32)
    result = build(model, None, calib={"x": calib}, verilog=False, log=lambda m: None)
    x = RNG.normal(0, 1, (4, 1, 3, 4, 5)).astype(np.float32)
    sim = simulate(result, {"x": x}, mode="golden")
    (quantize,) = [n for n in result.graph.nodes if n.op == "Quantize"]
    scale, zp = quantize.attrs["scale"], quantize.attrs["zero_point"]
    xq = np.clip(np.rint(x / np.float32(scale)) + zp, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(sim.int_outputs.reshape(4, 3, 12, 10),
                                  xq[:, 0].repeat(3, axis=2).repeat(2, axis=3))


@pytest.mark.rtl
def test_decoder_on_rtl(tmp_path):
    """A U-Net-style decoder: ConvTranspose k3 s2 p1 op1 with its ReLU, a nearest x2 Resize, a
    ConvTranspose k2 s2 of two groups, a 3x3 Conv; every phase a convolution whose POSTs
    write every second pixel. RTL equals golden bit for bit, in the predicted cycles."""
    w1 = RNG.normal(0, 0.3, (4, 6, 3, 3)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (6, 2, 2, 2)).astype(np.float32)
    w3 = RNG.normal(0, 0.3, (5, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w1"], ["c"], strides=[2, 2],
                              pads=[1, 1, 1, 1], output_padding=[1, 1], name="up1"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Resize", ["r", "", "sc"], ["u"], mode="nearest", name="up2"),
             helper.make_node("ConvTranspose", ["u", "w2"], ["t"], strides=[2, 2], group=2,
                              name="up3"),
             helper.make_node("Conv", ["t", "w3"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    model = make_model(nodes, {"x": [1, 4, 3, 3]}, {"y": [1, 5, 24, 24]},
                       {"w1": w1, "w2": w2, "w3": w3,
                        "sc": np.array([1, 1, 2, 2], np.float32)}, opset=17)
    calib = RNG.normal(0, 1, (16, 1, 4, 3, 3)).astype(np.float32)
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    names = [layer.name for layer in result.program.layers]
    assert names[:4] == [f"up1 [phase {py},{px}]" for py in (0, 1) for px in (0, 1)]
    inputs = {"x": RNG.normal(0, 1, (4, 1, 4, 3, 3)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 4
    want = evaluate_float(load_model(model), {"x": inputs["x"][:, 0]})["y"]
    err = np.abs(golden.outputs["y"].reshape(want.shape) - want).max()
    print(f"\ndecoder: golden vs float max |diff| {err:.4f} (output range "
          f"{np.abs(want).max():.2f})")
