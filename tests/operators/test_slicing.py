"""Slice and Split of computed tensors (channels, height, width; features of a vector) and
Concat along height and width (issue 13, "Upsampling and slicing"): the float ops against
onnxruntime's reference path, the integer ops as exact copies, the RTL bit-exact in the
predicted cycles, and the refusals, every one in one error."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_session
from spec_helpers import make_model

RNG = np.random.default_rng(41)


def i64(values):
    return np.array(values, np.int64)


def network():
    """Conv -> Split (channels 2 + 4) -> a Slice of H and W of each part -> Concat along H of
    one part with itself (with a ReLU), Convs, Concat along W of the two branches."""
    w = RNG.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (5, 2, 3, 3)).astype(np.float32)
    w3 = RNG.normal(0, 0.3, (5, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Split", ["c", "sp"], ["a", "b"], axis=1, name="split"),
             helper.make_node("Slice", ["a", "st", "en", "ax"], ["s"], name="slice"),
             helper.make_node("Concat", ["s", "s"], ["h"], axis=2, name="cat_h"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["p"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Slice", ["b", "st2", "en2", "ax2"], ["bs"], name="slice2"),
             helper.make_node("Conv", ["bs", "w3"], ["q"], pads=[1, 1, 1, 1], name="conv3"),
             helper.make_node("Concat", ["q", "q"], ["qq"], axis=-2, name="cat_h2"),
             helper.make_node("Concat", ["p", "qq"], ["y"], axis=3, name="cat_w")]
    # slice: rows 1..4, columns 2..5 (end past the size clamps); slice2: negative starts
    return make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 5, 8, 8]},
                      {"w": w, "w2": w2, "w3": w3, "sp": i64([2, 4]), "st": i64([1, 2]),
                       "en": i64([5, 100]), "ax": i64([2, 3]), "st2": i64([-6, -5]),
                       "en2": i64([4, 5]), "ax2": i64([-2, -1])}, opset=17)


def test_float_ops_equal_onnxruntime():
    model = network()
    graph = load_model(model)
    assert [n.op for n in graph.nodes].count("Slice") == 4
    x = RNG.normal(0, 1, (3, 3, 6, 6)).astype(np.float32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-5,
                               atol=1e-5)


def test_integer_slices_and_concats_copy_exactly():
    """x -> Slice (channels 1..3, rows 2..5, columns 1..4) and Slice (channel 0, rows 0..3,
    all columns 0..3): Concat along W; the int8 output is the quantized input's windows,
    joined, exactly."""
    nodes = [helper.make_node("Slice", ["x", "s1", "e1"], ["a"], name="a"),
             helper.make_node("Slice", ["x", "s2", "e2"], ["b"], name="b"),
             helper.make_node("Concat", ["a", "b", "b"], ["y"], axis=3, name="cat")]
    model = make_model(nodes, {"x": [1, 4, 6, 5]}, {"y": [1, 3, 3, 10]},
                       {"s1": i64([0, 1, 2, 1]), "e1": i64([1, 4, 5, 5]),
                        "s2": i64([0, 0, 0, 0]), "e2": i64([1, 3, 3, 3])}, opset=17)
    result = build(model, None, calib={"x": RNG.normal(0, 1, (8, 1, 4, 6, 5)).astype(
        np.float32)}, verilog=False, log=lambda m: None)
    x = RNG.normal(0, 1, (3, 1, 4, 6, 5)).astype(np.float32)
    sim = simulate(result, {"x": x}, mode="golden")
    (quantize,) = [n for n in result.graph.nodes if n.op == "Quantize"]
    scale, zp = quantize.attrs["scale"], quantize.attrs["zero_point"]
    xq = np.clip(np.rint(x[:, 0] / np.float32(scale)) + zp, -128, 127).astype(np.int8)
    a, b = xq[:, 1:4, 2:5, 1:5], xq[:, 0:3, 0:3, 0:3]
    np.testing.assert_array_equal(sim.int_outputs.reshape(3, 3, 3, 10),
                                  np.concatenate([a, b, b], axis=3))


@pytest.mark.rtl
def test_slices_and_concats_on_rtl(tmp_path):
    """Every Slice a 1x1 copy whose window starts inside its input (negative begin pads),
    every Concat along H or W one copy per source written at its offset: RTL equals golden
    bit for bit, in the predicted cycles."""
    model = network()
    calib = RNG.normal(0, 1, (16, 1, 3, 6, 6)).astype(np.float32)
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    names = [layer.name for layer in result.program.layers]
    assert "cat_w [source 1]" in names and "split/1" in names
    inputs = {"x": RNG.normal(0, 1, (4, 1, 3, 6, 6)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 4


@pytest.mark.rtl
def test_slice_of_a_vector_on_rtl(tmp_path):
    """Gemm -> Slice of features 3..12 -> Gemm: the selected lanes of the vector's words."""
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
             helper.make_node("Slice", ["h", "s", "e", "a"], ["k"], name="pick"),
             helper.make_node("Gemm", ["k", "w2"], ["y"], name="fc2", transB=1)]
    model = make_model(nodes, {"x": [1, 12]}, {"y": [1, 4]},
                       {"w1": RNG.normal(0, 0.4, (20, 12)).astype(np.float32),
                        "w2": RNG.normal(0, 0.4, (4, 10)).astype(np.float32),
                        "s": i64([3]), "e": i64([13]), "a": i64([1])}, opset=17)
    inputs = {"x": RNG.normal(0, 1, (4, 12)).astype(np.float32)}
    calib = np.concatenate([inputs["x"], RNG.normal(0, 1, (16, 12)).astype(np.float32)])
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 4
    want = evaluate_float(load_model(model), inputs)["y"]      # (calibrated on these too)
    assert np.abs(golden.outputs["y"].reshape(want.shape) - want).max() <= \
        0.05 * np.abs(want).max()


def test_slices_without_a_mapping_are_refused_in_one_error():
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["p"], name="strided"),
             helper.make_node("Slice", ["x", "s0", "e0", "a0"], ["q"], name="batch"),
             helper.make_node("Concat", ["p", "p"], ["y"], axis=0, name="stack")]
    model = make_model(nodes, {"x": [1, 2, 6, 6]}, {"y": [2, 2, 3, 6]},
                       {"s": i64([0]), "e": i64([6]), "a": i64([2]), "st": i64([2]),
                        "s0": i64([0]), "e0": i64([1]), "a0": i64([1])}, opset=17)
    model.graph.output.append(helper.make_tensor_value_info("q", 1, [1, 1, 6, 6]))
    with pytest.raises(UnsupportedOperatorError) as info:
        load_model(model)
    message = str(info.value)
    assert "Slice 'strided' has step 2 along axis 2" in message
    assert "Concat 'stack' along axis 0 (batch)" in message


def pad_model(mode, pads, h=5, w=6):
    """Pad (mode, [top, left, bottom, right] as ONNX's [.., t, l, .., b, r]) -> Conv 3x3."""
    weight = np.random.default_rng(3).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["x", "p"], ["q"], mode=mode, name="pad"),
             helper.make_node("Conv", ["q", "w"], ["y"], name="conv")]
    out = (h + pads[2] + pads[6] - 2, w + pads[3] + pads[7] - 2)
    return make_model(nodes, {"x": [1, 3, h, w]}, {"y": [1, 4, *out]},
                      {"p": i64(pads), "w": weight}, opset=19)


@pytest.mark.parametrize("mode, pads", [("reflect", [0, 0, 1, 2, 0, 0, 2, 1]),
                                        ("edge", [0, 0, 2, 0, 0, 0, 1, 3]),
                                        ("wrap", [0, 0, 1, 1, 0, 0, 1, 1])])
def test_pad_modes_as_copies_equal_onnxruntime(mode, pads):
    """reflect, edge and wrap: Slices of the rows (then columns) the padded image repeats,
    joined by Concats along height and width."""
    model = pad_model(mode, pads)
    graph = load_model(model)
    assert {n.op for n in graph.nodes} == {"Slice", "Concat", "Conv"}
    x = RNG.normal(0, 1, (2, 3, 5, 6)).astype(np.float32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_array_equal(evaluate_float(graph, {"x": x})["y"], want)


def test_pads_a_copy_cannot_make_are_refused():
    with pytest.raises(UnsupportedOperatorError, match="Pad 'pad' reflects 5 and 0 positions "
                                                       "along axis 2, of size 5"):
        load_model(pad_model("reflect", [0, 0, 5, 0, 0, 0, 0, 0]))


@pytest.mark.rtl
def test_reflect_pad_on_rtl(tmp_path):
    model = pad_model("reflect", [0, 0, 1, 2, 0, 0, 2, 1])
    calib = RNG.normal(0, 1, (16, 1, 3, 5, 6)).astype(np.float32)
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    inputs = {"x": RNG.normal(0, 1, (3, 1, 3, 5, 6)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 3
