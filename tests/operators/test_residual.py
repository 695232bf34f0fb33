"""The residual Add (two computed tensors of one shape) on the element-wise engine (issue 13):
each input keeps its own scale and zero point and the sum is requantized once, as the QDQ float
semantics define it; int8 weights in the ratio of the scales (``QAdd`` on the array) only where
the engine cannot take it: an architecture without it, or an operand that is a reshaped tensor.
RTL equals golden in the predicted cycles; golden follows the exact sum of its int8 inputs."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build
from hwonnx.config import ArchConfig
from hwonnx.golden import evaluate
from hwonnx.golden.ops import quantize
from hwonnx.quant.eltwise import ELTWISE_UNIT
from rtl_helpers import float_reference, rtl_matches_golden
from spec_helpers import make_model

RNG = np.random.default_rng(29)
QUIET = lambda message: None                                           # noqa: E731
#: How much smaller the second branch's weights are: int8 weights in about this ratio of the
#: branches' scales round it coarsely (127:3.4 to 127:3 would be a 12 % error on that input).
RATIO = 37.3


def residual_model(flatten: bool = False):
    """y = Relu(conv_a(x)) + conv_b(x), conv_b's weights RATIO times smaller (``flatten``:
    the two branches flattened to [1, 144] before the Add)."""
    wa = RNG.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32)
    wb = (RNG.normal(0, 0.5, (4, 4, 3, 3)) / RATIO).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["ca"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["ca"], ["a"], name="relu_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1])]
    if flatten:
        nodes += [helper.make_node("Flatten", ["a"], ["fa"], name="flat_a"),
                  helper.make_node("Flatten", ["b"], ["fb"], name="flat_b"),
                  helper.make_node("Add", ["fa", "fb"], ["y"], name="residual")]
    else:
        nodes.append(helper.make_node("Add", ["a", "b"], ["y"], name="residual"))
    out = [1, 144] if flatten else [1, 4, 6, 6]
    return make_model(nodes, {"x": [1, 4, 6, 6]}, {"y": out}, {"wa": wa, "wb": wb}, opset=13)


MODEL, FLAT = residual_model(), residual_model(flatten=True)
CALIB = RNG.normal(0, 1, (64, 1, 4, 6, 6)).astype(np.float32)


def _build(model, config=None):
    return build(model, None, calib={"x": CALIB}, config=config or ArchConfig(),
                 verilog=False, log=QUIET)


def _sum_error(result, x) -> "tuple[float, dict]":
    """The largest difference, in output steps, between the residual layer's int8 output and
    the exact real sum of its two int8 inputs (dequantized, added, quantized without
    rounding), over the values inside the clamp; and the layer's attributes."""
    add = next(n for n in result.graph.nodes if n.op in ("QEltwise", "QAdd"))
    quant = next(n for n in result.graph.nodes if n.op == "Quantize")
    env = evaluate(result.graph, {quant.outputs[0]: quantize(x, **quant.attrs)}, keep_all=True)
    attrs = add.attrs
    a, b = (env[v].astype(np.float64) for v in add.inputs[:2])
    exact = (attrs["a_scale"] * (a - attrs["za"]) + attrs["b_scale"] * (b - attrs["zb"])) \
        / attrs["out_scale"] + attrs["out_zp"]
    got = env[add.outputs[0]].astype(np.float64)
    inside = (exact >= attrs["lo"]) & (exact <= attrs["hi"])
    return float(np.abs(got - exact)[inside].max()), add


def test_residual_add_is_requantized_once_on_the_engine():
    """On the engine the sum is the exact real sum of the two int8 inputs, rounded once:
    within half an output step plus the bound of docs/arithmetic.md (``255 max(sa, sb) /
    (2**16 so)``). The array's int8 weights (127:6 for a scale ratio of 19.6) miss it by a
    quarter of a step more (measured 0.81 steps)."""
    x = CALIB[:16, 0]
    engine = _build(MODEL)
    error, add = _sum_error(engine, x)
    bound = 0.5 + 255 * max(add.attrs["a_scale"], add.attrs["b_scale"]) / (
        ELTWISE_UNIT * add.attrs["out_scale"]) + 1e-9
    assert add.op == "QEltwise" and add.attrs["mode"] == "sum" and not add.attrs["mul"]
    array = _build(MODEL, ArchConfig(eltwise=False))
    array_error, array_add = _sum_error(array, x)
    assert array_add.op == "QAdd"
    print(f"\nresidual sum vs the exact sum of its int8 inputs: engine {error:.3f} steps "
          f"(bound {bound:.3f}), int8 weights {array_add.attrs['wa']}:{array_add.attrs['wb']} "
          f"for a scale ratio of {add.attrs['a_scale'] / add.attrs['b_scale']:.2f}, "
          f"{array_error:.3f} steps")
    assert error <= bound
    assert array_error > bound + 0.25


def test_architecture_without_the_engine_sums_on_the_array():
    """ArchConfig.eltwise off, and an array with fewer columns than rows (the engine writes
    the rows lanes of a word into one accumulator word): the residual Add is a QAdd layer."""
    model = MODEL
    for config in (ArchConfig(eltwise=False), ArchConfig(rows=8, cols=4)):
        result = _build(model, config)
        assert [layer.op for layer in result.program.layers] == ["QConv", "QConv", "QAdd"]
        assert not any(n.op == "QEltwise" for n in result.graph.nodes)
    result = _build(model)
    assert [layer.op for layer in result.program.layers] == ["QConv", "QConv", "QEltwise"]


@pytest.mark.rtl
@pytest.mark.parametrize("flatten", [False, True])
def test_residual_add_on_rtl(flatten):
    """RTL equal to golden, every layer, in the predicted cycles: the engine's sum of two
    images, and the array's QAdd of two flattened images (the engine reads tensors in their
    natural order only); golden within three output steps of onnxruntime on the float model
    (measured 2.8 and 2.3: the convolutions' int8 weights and outputs, then the sum's
    rounding)."""
    model = FLAT if flatten else MODEL
    result = _build(model)
    op = "QAdd" if flatten else "QEltwise"
    assert [layer.op for layer in result.program.layers] == ["QConv", "QConv", op]
    x = CALIB[:4]                   # inside the calibrated ranges: no saturation
    rtl = rtl_matches_golden(result, {"x": x}, 4)
    want = float_reference(model, x)
    step = next(n for n in result.graph.nodes if n.op == "Dequantize").attrs["scale"]
    error = np.abs(rtl.outputs["y"].reshape(want.shape) - want).max() / step
    print(f"\n{op}: golden vs float {error:.2f} output steps")
    assert error <= 3.0
