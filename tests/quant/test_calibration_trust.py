"""No silent wrong answer from calibration: a dead ReLU branch must not zero the live one, an
Add that would round an input away is refused, constant calibration data is refused, and the
golden model is checked against the float model layer by layer (warning, report)."""

import logging
import re

import numpy as np
import pytest
from onnx import helper, numpy_helper

from hwonnx import api
from hwonnx.compiler.lower import lower
from hwonnx.config import ArchConfig
from hwonnx.errors import QuantizationError
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate
from hwonnx.golden.ops import quantize
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.quant import quantize_graph
from hwonnx.quant.check import check_layers
from hwonnx.quant.eltwise import ELTWISE_UNIT
from hwonnx.report import build_report

from helpers import raises
from ort_reference import reference_outputs


def _two_branches(b2: float, w2_scale: float = 0.1):
    """y = Relu(Conv1(x)) + Relu(Conv2(x)); Conv2's bias ``b2`` (-100: the branch is dead on
    every input) and weight scale ``w2_scale``."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1"),
             helper.make_node("Relu", ["c1"], ["live"], name="relu1"),
             helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["dead"], name="relu2"),
             helper.make_node("Add", ["live", "dead"], ["y"], name="add")]
    inits = {"w1": rng.standard_normal((4, 4, 1, 1)) * 0.1, "b1": np.zeros(4),
             "w2": rng.standard_normal((4, 4, 1, 1)) * w2_scale, "b2": np.full(4, b2)}
    graph = helper.make_graph(
        nodes, "branches", [helper.make_tensor_value_info("x", 1, [1, 4, 4, 4])],
        [helper.make_tensor_value_info("y", 1, [1, 4, 4, 4])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def _calib_and_inputs():
    rng = np.random.default_rng(0)
    rng.standard_normal((4, 4, 1, 1)), rng.standard_normal((4, 4, 1, 1))   # the weights
    return (rng.standard_normal((16, 1, 4, 4, 4)).astype(np.float32),
            rng.standard_normal((4, 1, 4, 4, 4)).astype(np.float32))


@pytest.mark.parametrize("engine", [True, False])
def test_dead_relu_branch_keeps_the_live_input(caplog, engine):
    """The dead branch is constant 0 on the calibration data. With the fallback scale 1.0 it
    made the Add weight the live input 0: every output 0 where onnxruntime gives up to 0.59.
    It now takes the Add output's scale (a warning names it) and the output follows the
    float model within the int8 error, on the element-wise engine (the two inputs weighted
    equally) and on the array of an architecture without it (int8 weights 127 and 127)."""
    model = _two_branches(-100.0)
    calib, x = _calib_and_inputs()
    with caplog.at_level(logging.WARNING, logger="hwonnx"):
        result = api.build(model, None, calib={"x": calib}, verilog=False,
                           config=ArchConfig(eltwise=engine), log=lambda *_: None)
    (warning,) = [w for w in result.graph.meta["warnings"] if "'dead'" in w]
    scale = result.graph.nodes[-1].attrs["scale"]                  # the output Dequantize
    assert warning == (f"'dead' (output of 'conv2') is constant 0 on every calibration sample "
                       f"(a dead branch?); it takes the scale {scale:.4g} of 'y', the output "
                       f"of Add 'add'")
    assert warning in caplog.text
    if engine:
        add = next(n for n in result.graph.nodes if n.op == "QEltwise")
        assert add.attrs["ka"] == add.attrs["kb"] == ELTWISE_UNIT
    else:
        add = next(n for n in result.graph.nodes if n.op == "QAdd")
        assert add.attrs["wa"] == add.attrs["wb"] == 127
    golden = api.simulate(result, {"x": x}, mode="golden").outputs["y"]
    want = reference_outputs(model, {"x": x[:, 0]})[0]
    error = np.abs(golden.reshape(want.shape) - want).max()
    print(f"dead branch: float output up to {want.max():.3f}, int8 error {error:.4f} "
          f"({error / scale:.2f} LSB)")
    assert want.max() > 0.3
    assert error <= 2 * scale
    assert all(row["coverage"] > 0.9 for row in result.graph.meta["layer_check"]
               if row["layer"] == "add")


def test_add_of_very_different_scales_keeps_both_inputs_on_the_engine():
    """A live input 1000x smaller than the other: the element-wise engine weights it by
    integers in the ratio of the scales to 2**-17, so it is kept, and each output is within
    one output step of the float sum computed from the two int8 inputs (their own rounding
    apart, the engine's sum rounds once)."""
    model = _two_branches(0.0, w2_scale=1e-4)
    calib, x = _calib_and_inputs()
    result = api.build(model, None, calib={"x": calib}, verilog=False, log=lambda *_: None)
    add = next(n for n in result.graph.nodes if n.op == "QEltwise")
    small, large = sorted((add.attrs["a_scale"], add.attrs["b_scale"]))
    assert large / small > 254                       # QAdd's int8 weight would round to 0
    assert min(abs(add.attrs["ka"]), abs(add.attrs["kb"])) > 0
    quant = next(n for n in result.graph.nodes if n.op == "Quantize")
    env = evaluate(result.graph, {quant.outputs[0]: quantize(x[:, 0], **quant.attrs)},
                   keep_all=True)
    a, b = (env[v].astype(np.float64) for v in add.inputs[:2])
    exact = (add.attrs["a_scale"] * (a - add.attrs["za"]) + add.attrs["b_scale"]
             * (b - add.attrs["zb"])) / add.attrs["out_scale"] + add.attrs["out_zp"]
    got = env[add.outputs[0]].astype(np.float64)
    inside = (exact >= add.attrs["lo"]) & (exact <= add.attrs["hi"])
    assert np.abs(got - exact)[inside].max() <= 0.5 + 1e-3
    assert np.count_nonzero(b != add.attrs["zb"]) > 0      # the small input is not all zero


def test_add_that_would_drop_an_input_is_refused_without_the_engine():
    """Without the element-wise engine, the array weights the inputs by int8 integers: a live
    input 1000x smaller than the other would get weight 0, which is refused."""
    model = _two_branches(0.0, w2_scale=1e-4)
    calib, _ = _calib_and_inputs()
    with pytest.raises(QuantizationError, match=r"^Add 'add': input 'dead' has scale \S+, "
                       r"\d+x smaller than input 'live' \(\S+\); without the element-wise "
                       r"engine the array weights the two inputs by int8 integers in that "
                       r"ratio, so 'dead' would get weight 0 and vanish \(use an architecture "
                       r"with ArchConfig.eltwise\)$"):
        api.build(model, None, calib={"x": calib}, verilog=False,
                  config=ArchConfig(eltwise=False), log=lambda *_: None)


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_constant_calibration_input_is_refused(value):
    graph = load_model(_two_branches(0.0))
    with raises(QuantizationError, f"Calibration data for input 'x' is constant ({value:g} in "
                f"every sample and position): it gives the input no range to quantize; pass "
                f"representative samples"):
        quantize_graph(graph, {"x": np.full((8, 4, 4, 4), value, np.float32)})


def test_layer_check_warns_when_a_layer_loses_its_range(caplog):
    """The check compares each layer's dequantized golden output with the float value: fed a
    float model whose Add output is ten times wider than what the int8 output covers, it
    names the layer; the build report carries the rows."""
    graph = load_model(_two_branches(0.0))
    calib, _ = _calib_and_inputs()
    feeds = {"x": calib[:, 0]}
    int_graph = quantize_graph(graph, feeds)
    rows = {row["layer"]: row for row in int_graph.meta["layer_check"]}
    assert set(rows) == {"quantize_x", "conv1", "conv2", "add"}
    assert all(row["coverage"] > 0.95 and row["max_error_lsb"] < 3 for row in rows.values())
    values = evaluate_float(graph, feeds, keep_all=True)
    values["y"] = values["y"] * 10
    params = {"x": (1.0, 0), "live": (1.0, 0), "dead": (1.0, 0),
              "y": (int_graph.nodes[-1].attrs["scale"], int_graph.nodes[-1].attrs["zero_point"])}
    with caplog.at_level(logging.WARNING, logger="hwonnx"):
        checked = check_layers(int_graph, values, feeds, {"y": params["y"]})
    (warning,) = [w for w in checked.meta["warnings"] if w.startswith("Layer 'add'")]
    assert re.fullmatch(r"Layer 'add': its int8 output covers 10% of the float model's range "
                        r"on the calibration data \(float \[\S+, \S+\], int8 \[\S+, \S+\]\); "
                        r"the quantized model lost most of this signal", warning)
    assert warning in caplog.text
    program = lower(checked, ArchConfig())
    report = build_report(program, "m.onnx", "sim", checked.meta, checked)
    assert report["layer_check"][0]["layer"] == "add"
    assert warning in report["warnings"]


def test_complex_calibration_data_is_refused():
    """astype(float32) would silently drop the imaginary part."""
    calib = (np.ones((4, 4, 4, 4)) + 1j).astype(np.complex64)
    with raises(QuantizationError, "Calibration data: array 'x' is complex (complex64); "
                "hwonnx's inputs are real"):
        api.compile_model(_two_branches(0.0), {"x": calib}, config=ArchConfig(),
                          log=lambda *_: None)
