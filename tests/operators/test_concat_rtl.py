"""Channel Concat through the whole flow on the Verilator RTL: an Inception-like block (Conv
branches of different scales joined by Concat, then a Conv), a vector Concat of Gemm outputs
(with a repeated input) and a Concat of a flattened feature map with a pooled vector. The RTL
equals golden bit for bit, layer by layer, the cycles equal the prediction, and golden stays
close to onnxruntime on the float model."""

import numpy as np
import onnx
import pytest
from onnx import helper

from hwonnx.api import build
from hwonnx.report import placement

from rtl_helpers import CONFIGS, float_reference, he_weight, rtl_matches_golden
from spec_helpers import make_model

pytestmark = pytest.mark.rtl

def _model(nodes, inits, x_shape, y_shape) -> onnx.ModelProto:
    return make_model(nodes, {"x": x_shape}, {"y": y_shape}, inits, opset=13)


_weight = he_weight


def _inception(rng) -> onnx.ModelProto:
    """x -> {1x1 Conv + Relu, 3x3 Conv (signed, another scale), 1x1 Conv + Relu6} -> Concat
    (6 + 5 + 3 = 14 channels) -> 3x3 Conv -> y."""
    inits = {"wa": _weight(rng, 6, 3, 1, 1), "wb": _weight(rng, 5, 3, 3, 3, gain=3.0),
             "wc": _weight(rng, 3, 3, 1, 1, gain=0.5), "wd": _weight(rng, 4, 14, 3, 3),
             "bd": rng.normal(0, 0.1, 4).astype(np.float32),
             "zero": np.float32(0), "six": np.float32(6)}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="branch_a"),
             helper.make_node("Relu", ["a"], ["ar"], name="relu_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="branch_b", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wc"], ["c"], name="branch_c"),
             helper.make_node("Clip", ["c", "zero", "six"], ["cr"], name="relu6_c"),
             helper.make_node("Concat", ["ar", "b", "cr"], ["cat"], name="concat", axis=1),
             helper.make_node("Conv", ["cat", "wd", "bd"], ["y"], name="mix",
                              pads=[1, 1, 1, 1])]
    return _model(nodes, inits, [1, 3, 7, 6], [1, 4, 7, 6])


def _vectors(rng) -> onnx.ModelProto:
    """x [1, 12] -> Gemm (7) and Gemm + Relu (10) -> Concat(g1, g2, g1) [1, 24] -> Gemm."""
    inits = {"w1": _weight(rng, 12, 7), "w2": _weight(rng, 12, 10, gain=4.0),
             "b2": rng.normal(0, 0.5, 10).astype(np.float32), "w3": _weight(rng, 24, 5)}
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["g1"], name="fc1"),
             helper.make_node("Gemm", ["x", "w2", "b2"], ["g2"], name="fc2"),
             helper.make_node("Relu", ["g2"], ["r2"], name="relu2"),
             helper.make_node("Concat", ["g1", "r2", "g1"], ["cat"], name="concat", axis=1),
             helper.make_node("Gemm", ["cat", "w3"], ["y"], name="fc3")]
    return _model(nodes, inits, [1, 12], [1, 5])


def _flattened(rng) -> onnx.ModelProto:
    """A Conv feature map, flattened (pixel-major lanes), joined with a pooled vector."""
    inits = {"w1": _weight(rng, 4, 3, 3, 3), "w2": _weight(rng, 4 * 2 * 2 + 3, 6)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("GlobalAveragePool", ["x"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["gf"], name="flatten_pool"),
             helper.make_node("Concat", ["gf", "f"], ["cat"], name="concat", axis=-1),
             helper.make_node("Gemm", ["cat", "w2"], ["y"], name="fc")]
    return _model(nodes, inits, [1, 3, 5, 5], [1, 6])


MODELS = {"inception": (_inception, (1, 3, 7, 6)), "vectors": (_vectors, (1, 12)),
          "flattened": (_flattened, (1, 3, 5, 5))}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_concat_model_rtl_equals_golden(name, config_name):
    config = CONFIGS[config_name]
    make, shape = MODELS[name]
    rng = np.random.default_rng(sorted(MODELS).index(name))
    model = make(rng)
    calib = rng.uniform(-1, 1, (64, *shape)).astype(np.float32)
    result = build(model, None, calib={"x": calib}, config=config, log=lambda message: None)
    rows = {row["node"]: row for row in placement(result.graph)}
    assert (rows["concat"]["op"], rows["concat"]["where"]) == ("QConcat", "hardware")
    concat = next(n for n in result.graph.nodes if n.op == "QConcat")
    scales = concat.attrs["scales"]
    assert len(set(scales)) > 1          # sources requantized into the output scale

    samples = 6
    inputs = {"x": rng.uniform(-1, 1, (samples, *shape)).astype(np.float32)}
    # every output and every layer's, the Concat's included, equals golden
    rtl = rtl_matches_golden(result, inputs, samples)
    reference = float_reference(model, inputs["x"])
    error = np.abs(rtl.outputs["y"].reshape(reference.shape) - reference).max()
    print(f"\n{name} on {config_name}: {len(result.program.layers)} layers, "
          f"{rtl.predicted_cycles} cycles; concat scales {[f'{s:.4g}' for s in scales]} -> "
          f"{concat.attrs['out_scale']:.4g}; int8 vs float max |difference| {error:.4f} "
          f"(output range {np.ptp(reference):.2f})")
    assert error < 0.05 * np.ptp(reference)
