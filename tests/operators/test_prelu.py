"""PRelu (issue 13): one slope is the LeakyRelu table; one slope per channel in [0, 1] is
max(x, slope x), a per-channel scale and a Max on the element-wise engine. The float graph
equals onnxruntime's reference path, the int8 result follows the float model within a stated
bound, the RTL equals golden in the predicted cycles, and other slopes are refused by name."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_session
from spec_helpers import make_model

RNG = np.random.default_rng(61)
W = RNG.normal(0, 0.4, (6, 3, 3, 3)).astype(np.float32)


def prelu_model(slope):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("PRelu", ["c", "s"], ["y"], name="prelu")]
    return make_model(nodes, {"x": [1, 3, 5, 5]}, {"y": [1, 6, 5, 5]},
                      {"w": W, "s": np.asarray(slope, np.float32)}, opset=13)


@pytest.mark.parametrize("slope, ops", [
    ([0.25], ["Conv", "LeakyRelu"]),
    (RNG.uniform(0, 1, (6, 1, 1)), ["Conv", "Conv", "Eltwise"]),
    (RNG.uniform(0, 1, (1, 6, 1, 1)), ["Conv", "Conv", "Eltwise"])])
def test_prelu_float_equals_onnxruntime(slope, ops):
    model = prelu_model(slope)
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ops
    x = RNG.normal(0, 1, (3, 3, 5, 5)).astype(np.float32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-6,
                               atol=1e-6)


def test_slopes_outside_zero_to_one_are_refused_by_name():
    slope = np.linspace(-0.5, 1.5, 6).reshape(6, 1, 1)
    with pytest.raises(UnsupportedOperatorError, match=r"PRelu 'prelu' has a slope of shape "
                                                       r"\[6, 1, 1\] \(from -0.5 to 1.5\)"):
        load_model(prelu_model(slope))


@pytest.mark.rtl
def test_per_channel_prelu_on_rtl(tmp_path):
    """Bit-exact in the predicted cycles; against the float model within 3 output steps (the
    conv's and the scale's roundings, then the engine's requantization; measured below)."""
    model = prelu_model(RNG.uniform(0, 1, (6, 1, 1)))
    x = RNG.normal(0, 1, (4, 1, 3, 5, 5)).astype(np.float32)
    calib = np.concatenate([x, RNG.normal(0, 1, (16, 1, 3, 5, 5)).astype(np.float32)])
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    rtl = simulate(tmp_path / "build", {"x": x}, mode="compare", log=lambda m: None)
    golden = simulate(result, {"x": x}, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 4
    (dq,) = [n for n in result.graph.nodes if n.op == "Dequantize"]
    want = evaluate_float(load_model(model), {"x": x[:, 0]})["y"]
    steps = np.abs(golden.outputs["y"].reshape(want.shape) - want) / dq.attrs["scale"]
    print(f"\nper-channel PRelu: max {steps.max():.2f} output steps from float")
    assert steps.max() <= 3
