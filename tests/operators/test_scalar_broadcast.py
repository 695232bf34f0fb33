"""A computed scalar ([1, 1, 1, 1]) combined with an image (issue 13: "scalar" broadcasting):
spread to [1, C, 1, 1] by a 1x1 copy, then the element-wise engine's per-channel broadcast.
Before, an Add of such shapes became a residual QAdd that read the scalar as an image: the RTL
differed from golden. Float equals onnxruntime; RTL equals golden in the predicted cycles."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_session
from spec_helpers import make_model

RNG = np.random.default_rng(71)


def scalar_model(op, scalar_first):
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("Conv", ["x", "ws"], ["s"], name="conv_s", strides=[4, 5]),
             helper.make_node(op, ["s", "a"] if scalar_first else ["a", "s"], ["y"],
                              name="elt")]
    return make_model(nodes, {"x": [1, 3, 4, 5]}, {"y": [1, 4, 4, 5]},
                      {"wa": RNG.normal(0, 0.5, (4, 3, 1, 1)).astype(np.float32),
                       "ws": RNG.normal(0, 0.3, (1, 3, 4, 5)).astype(np.float32)}, opset=13)


@pytest.mark.rtl
@pytest.mark.parametrize("op, scalar_first", [("Add", True), ("Sub", True), ("Sub", False),
                                              ("Mul", False), ("Max", True)])
def test_scalar_beside_an_image(op, scalar_first, tmp_path):
    model = scalar_model(op, scalar_first)
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["Conv", "Conv", "Conv", "Eltwise"]
    x = RNG.normal(0, 1, (3, 3, 4, 5)).astype(np.float32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-5,
                               atol=1e-5)
    calib = np.concatenate([x[:, None], RNG.normal(0, 1, (16, 1, 3, 4, 5)).astype(np.float32)])
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    rtl = simulate(tmp_path / "build", {"x": x[:, None]}, mode="compare", log=lambda m: None)
    golden = simulate(result, {"x": x[:, None]}, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 3
    (dq,) = [n for n in result.graph.nodes if n.op == "Dequantize"]
    steps = np.abs(golden.outputs["y"].reshape(want.shape) - want) / dq.attrs["scale"]
    assert steps.max() <= 3          # three roundings: the two Convs' and the engine's
