"""Data-moving Transposes of computed tensors (issue 13, "Layout"): pairs that cancel (also
across element-wise nodes: a Keras/tf2onnx NHWC model's Transposes around a Relu) are removed,
a Transpose feeding the Flatten/Reshape of a Dense is folded into the order of its weight rows,
and any other is a data movement on the array (copies written with strides). A
channels-last model compiles to the same program as its NCHW twin, and runs bit-exact on the
RTL."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.golden import evaluate as golden_evaluate
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_session
from spec_helpers import make_model

RNG = np.random.default_rng(21)
W1 = RNG.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
FC = RNG.normal(0, 0.3, (64, 5)).astype(np.float32)      # rows in NHWC (h, w, c) order


def nhwc_model():
    """tf2onnx-style: NHWC input, Transposes around the Conv and the Relu, and Keras's NCHW ->
    NHWC Transpose before the Reshape of the Dense."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2], name="t_in"),
             helper.make_node("Conv", ["xt", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Transpose", ["c1"], ["ct"], perm=[0, 2, 3, 1], name="t_a"),
             helper.make_node("Relu", ["ct"], ["r1"], name="relu"),
             helper.make_node("Transpose", ["r1"], ["rb"], perm=[0, 3, 1, 2], name="t_b"),
             helper.make_node("Transpose", ["rb"], ["rt"], perm=[0, 2, 3, 1], name="t_flat"),
             helper.make_node("Reshape", ["rt", "shape"], ["f"], name="reshape"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    return make_model(nodes, {"x": [1, 4, 4, 3]}, {"y": [1, 5]},
                      {"w1": W1, "fc": FC, "shape": np.array([1, 64], np.int64)}, opset=17)


def nchw_twin():
    """The same network written channels-first: its Dense reads the NCHW flattening, so its
    weight rows are the NHWC model's in (c, h, w) order."""
    fc = FC.reshape(4, 4, 4, 5).transpose(2, 0, 1, 3).reshape(64, 5)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Flatten", ["r1"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    return make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5]}, {"w1": W1, "fc": fc},
                      opset=17)


def test_transposes_cancel_and_fold_into_the_dense_weights():
    graph = load_model(nhwc_model())
    body = [n.op for n in graph.nodes]
    assert body == ["Transpose", "Conv", "Reshape", "Dense"]     # the first: a host step
    assert graph.meta["host_steps"].keys() == {"t_in"}
    x = RNG.normal(0, 1, (4, 4, 4, 3)).astype(np.float32)
    session = reference_session(nhwc_model())
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    got = evaluate_float(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_channels_last_model_compiles_to_the_program_of_its_nchw_twin():
    calib = RNG.normal(0, 1, (16, 1, 3, 4, 4)).astype(np.float32)
    nhwc = build(nhwc_model(), None, calib={"x": calib.transpose(0, 1, 3, 4, 2)},
                 verilog=False, log=lambda m: None)
    nchw = build(nchw_twin(), None, calib={"x": calib}, verilog=False, log=lambda m: None)
    assert [i.fields for i in nhwc.program.instructions] == \
        [i.fields for i in nchw.program.instructions]
    assert nhwc.program.images == nchw.program.images


@pytest.mark.rtl
def test_channels_last_model_on_rtl(tmp_path):
    calib = RNG.normal(0, 1, (16, 1, 4, 4, 3)).astype(np.float32)
    result = build(nhwc_model(), tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    inputs = {"x": RNG.normal(0, 1, (5, 1, 4, 4, 3)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 5


PERMS = [(0, 1, 3, 2), (0, 2, 1, 3), (0, 3, 2, 1), (0, 2, 3, 1), (0, 3, 1, 2)]


def permute_model(perm, c=3, h=4, w=5):
    """Conv -> Transpose(perm) -> Conv: the Transpose moves data (no partner, no Dense)."""
    shape = [1, c, h, w]
    out = [shape[p] for p in perm]
    w1 = RNG.normal(0, 0.3, (c, 2, 3, 3)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (2, out[1], 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Transpose", ["a"], ["t"], perm=list(perm), name="move"),
             helper.make_node("Conv", ["t", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    return make_model(nodes, {"x": [1, 2, h, w]}, {"y": [1, 2, *out[2:]]},
                      {"w1": w1, "w2": w2}, opset=17)


@pytest.mark.parametrize("perm", PERMS)
def test_a_transpose_that_moves_data_is_an_exact_copy(perm):
    """Each permutation of C, H and W: the float Permute equals onnxruntime, and the integer
    QPermute's output is its input's integers, transposed, exactly."""
    model = permute_model(perm)
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["Conv", "Permute", "Conv"]
    x = RNG.normal(0, 1, (3, 2, 4, 5)).astype(np.float32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-5,
                               atol=1e-5)
    result = build(model, None, calib={"x": x[:, None]}, verilog=False, log=lambda m: None)
    (move,) = [n for n in result.graph.nodes if n.op == "QPermute"]
    env = golden_evaluate(result.graph, {"x": x}, keep_all=True)
    np.testing.assert_array_equal(env[move.outputs[0]], np.transpose(env[move.inputs[0]], perm))


@pytest.mark.rtl
@pytest.mark.parametrize("perm", PERMS)
def test_a_transpose_that_moves_data_on_rtl(perm, tmp_path):
    """Copies of rows (H <-> W) or channels (a kernel spanning the axis that becomes the
    channels), each written with strides: RTL equals golden, in the predicted cycles."""
    model = permute_model(perm)
    x = RNG.normal(0, 1, (3, 1, 2, 4, 5)).astype(np.float32)
    calib = np.concatenate([x, RNG.normal(0, 1, (16, 1, 2, 4, 5)).astype(np.float32)])
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    rtl = simulate(tmp_path / "build", {"x": x}, mode="compare", log=lambda m: None)
    golden = simulate(result, {"x": x}, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 3


def test_a_pair_that_does_not_cancel_becomes_one_transpose():
    """(0,2,3,1) twice is (0,3,1,2): one Transpose is left, feeding a Flatten of a Dense,
    which the next round folds into the weights; the float results stay those of onnx."""
    fc = RNG.normal(0, 0.3, (48, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["a"], perm=[0, 2, 3, 1], name="ta"),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 3, 1], name="tb"),
             helper.make_node("Flatten", ["b"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc")]
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5]}, {"fc": fc}, opset=17)
    graph = load_model(model)
    assert "Transpose" not in [n.op for n in graph.nodes]
    x = RNG.normal(0, 1, (3, 3, 4, 4)).astype(np.float32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-5,
                               atol=1e-5)
