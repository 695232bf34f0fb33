"""The element-wise engine through the whole flow on the Verilator RTL: a squeeze-and-excitation
gate (GlobalAveragePool -> Conv -> Sigmoid -> Mul with the feature map, a [1, C, 1, 1]
broadcast), SiLU as Sigmoid + Mul, an Add of two scales (broadcast, fused Relu), a Sub of equal
shapes, Max then Min (two engine layers back to back, several accumulator tiles on 3x5), a Mean
of three (chained sums) and Mul/Sub/Mean of [1, K] vectors. The RTL equals golden bit for bit,
layer by layer, the cycles equal the prediction, and golden stays close to onnxruntime on the
float model."""

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


def _se_gate(rng):
    """Conv (10 channels) scaled per channel by GlobalAveragePool -> Conv -> Sigmoid."""
    inits = {"w": _weight(rng, 10, 3, 3, 3), "ws": _weight(rng, 10, 3, 1, 1, gain=4.0),
             "bs": rng.normal(0, 0.5, 10).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["f"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["x"], ["g"], name="squeeze"),
             helper.make_node("Conv", ["g", "ws", "bs"], ["e"], name="excite"),
             helper.make_node("Sigmoid", ["e"], ["s"], name="gate"),
             helper.make_node("Mul", ["f", "s"], ["y"], name="scale")]
    return _model(nodes, inits, [1, 3, 5, 6], [1, 10, 5, 6]), "scale"


def _glu(rng):
    """conv_a(x) * sigmoid(conv_b(x)), a gated unit: a Mul of two computed images of equal
    shape. (x * sigmoid(x) itself is one Swish table: tests/frontend/test_patterns.py.)"""
    inits = {"w": _weight(rng, 6, 3, 3, 3, gain=2.0), "wb": _weight(rng, 6, 3, 3, 3, gain=2.0)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wb"], ["d"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["d"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["c", "s"], ["y"], name="glu")]
    return _model(nodes, inits, [1, 3, 5, 6], [1, 6, 5, 6]), "glu"


def _add_scales(rng):
    """A per-channel bias computed from the image (small scale) added to a Conv with a large
    one, then Relu."""
    inits = {"w": _weight(rng, 9, 3, 3, 3, gain=4.0), "wb": _weight(rng, 9, 3, 1, 1, gain=0.1)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["f"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalMaxPool", ["x"], ["g"], name="pool"),
             helper.make_node("Conv", ["g", "wb"], ["b"], name="bias_conv"),
             helper.make_node("Add", ["b", "f"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return _model(nodes, inits, [1, 3, 5, 6], [1, 9, 5, 6]), "add"


def _sub(rng):
    inits = {"wa": _weight(rng, 7, 3, 3, 3, gain=3.0), "wb": _weight(rng, 7, 3, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b"),
             helper.make_node("Sub", ["a", "b"], ["y"], name="sub")]
    return _model(nodes, inits, [1, 3, 5, 6], [1, 7, 5, 6]), "sub"


def _max_min(rng):
    """Min(Max(a, b), c) on a 9x10 image: two engine layers back to back, and on 3x5 five
    accumulator tiles of 32 pixels each."""
    inits = {k: _weight(rng, 4, 2, 3, 3, gain=g) for k, g in (("wa", 1), ("wb", 2), ("wc", 0.5))}
    nodes = [*(helper.make_node("Conv", ["x", w], [v], name=f"conv_{v}", pads=[1, 1, 1, 1])
               for v, w in (("a", "wa"), ("b", "wb"), ("c", "wc"))),
             helper.make_node("Max", ["a", "b"], ["m"], name="max"),
             helper.make_node("Min", ["m", "c"], ["y"], name="min")]
    return _model(nodes, inits, [1, 2, 9, 10], [1, 4, 9, 10]), "min"


def _vectors(rng):
    """Gemm outputs [1, 11]: Mul, then Sub, then Mean with the first."""
    inits = {f"w{i}": _weight(rng, 12, 11, gain=g) for i, g in ((1, 1), (2, 3), (3, 0.3))}
    nodes = [*(helper.make_node("Gemm", ["x", f"w{i}"], [f"g{i}"], name=f"fc{i}")
               for i in (1, 2, 3)),
             helper.make_node("Mul", ["g1", "g2"], ["p"], name="mul"),
             helper.make_node("Sub", ["p", "g3"], ["d"], name="sub"),
             helper.make_node("Mean", ["d", "g1"], ["y"], name="mean")]
    return _model(nodes, inits, [1, 12], [1, 11]), "mean"


def _mean3(rng):
    """Mean of three: a Conv, its global average (per channel) and another Conv: two chained
    engine layers, the first a broadcast sum, the second divided by 3."""
    inits = {"wa": _weight(rng, 5, 3, 3, 3), "wb": _weight(rng, 5, 3, 1, 1, gain=2.0)}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"], name="pool"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b"),
             helper.make_node("Mean", ["g", "a", "b"], ["y"], name="mean")]
    return _model(nodes, inits, [1, 3, 5, 6], [1, 5, 5, 6]), "mean"


MODELS = {"se_gate": (_se_gate, (1, 3, 5, 6)), "mean3": (_mean3, (1, 3, 5, 6)),
          "glu": (_glu, (1, 3, 5, 6)), "add_scales": (_add_scales, (1, 3, 5, 6)),
          "sub": (_sub, (1, 3, 5, 6)), "max_min": (_max_min, (1, 2, 9, 10)),
          "vectors": (_vectors, (1, 12))}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_eltwise_model_rtl_equals_golden(name, config_name):
    config = CONFIGS[config_name]
    make, shape = MODELS[name]
    rng = np.random.default_rng(sorted(MODELS).index(name))
    model, node = make(rng)
    calib = rng.uniform(-1, 1, (64, *shape)).astype(np.float32)
    result = build(model, None, calib={"x": calib}, config=config, log=lambda message: None)
    rows = {row["node"]: row for row in placement(result.graph)}
    assert (rows[node]["op"], rows[node]["where"]) == ("QEltwise", "hardware")
    q = next(n for n in result.graph.nodes if n.name == node)
    assert q.attrs["a_scale"] != q.attrs["b_scale"]    # each input with its own scale

    samples = 5            # calibration samples: no layer saturates (the error is the engine's
    inputs = {"x": calib[:samples]}                  # and the layers', not the range's)
    # every output and every layer's, the element-wise layers' included, equals golden
    rtl = rtl_matches_golden(result, inputs, samples)
    reference = float_reference(model, inputs["x"])
    error = np.abs(rtl.outputs["y"].reshape(reference.shape) - reference).max()
    print(f"\n{name} on {config_name}: {len(result.program.layers)} layers, "
          f"{rtl.predicted_cycles} cycles; {node} scales {q.attrs['a_scale']:.4g}, "
          f"{q.attrs['b_scale']:.4g} -> {q.attrs['out_scale']:.4g}; int8 vs float max "
          f"|difference| {error:.4f} (output range {np.ptp(reference):.2f})")
    assert error < 0.05 * np.ptp(reference)
