"""Data-moving Transposes of computed tensors (issue 13, "Layout"): pairs that cancel (also
across element-wise nodes: a Keras/tf2onnx NHWC model's Transposes around a Relu) are removed,
a Transpose feeding the Flatten/Reshape of a Dense is folded into the order of its weight rows,
and any other is refused by name. A channels-last model compiles to the same program as its
NCHW twin, and runs bit-exact on the RTL."""

import numpy as np
import onnx
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.errors import UnsupportedOperatorError
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


def test_a_transpose_that_moves_data_between_layers_is_refused_by_name():
    """Swapping H and W between two Convs needs a data movement; the error names it and the
    other one like it, in one message."""
    w2 = RNG.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Transpose", ["c1"], ["t1"], perm=[0, 1, 3, 2], name="swap1"),
             helper.make_node("Conv", ["t1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Transpose", ["c2"], ["t2"], perm=[0, 1, 3, 2], name="swap2"),
             helper.make_node("Conv", ["t2", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv3")]
    model = make_model(nodes, {"x": [1, 3, 4, 5]}, {"y": [1, 4, 4, 5]}, {"w1": W1, "w2": w2},
                       opset=17)
    onnx.checker.check_model(model)
    with pytest.raises(UnsupportedOperatorError) as info:
        load_model(model)
    assert [n[0] for n in info.value.nodes] == ["swap1", "swap2"]
    assert "Transpose 'swap1' (perm [0, 1, 3, 2]) moves data in the middle of the graph" \
        in str(info.value)


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
