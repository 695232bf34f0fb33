"""Unary functions exporters write as several nodes (hwonnx/frontend/patterns.py) become one
table operator: SiLU, x * HardSigmoid, Keras's hard-swish, PyTorch's GELU, Mish. The float
graph holds one node where the model has several, equal to onnxruntime's reference path on
the float model; the int8 result is one table after the layer, bit-exact on the RTL."""

import math

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.ir.tables import TABLE_OPS
from ort_reference import reference_session
from spec_helpers import make_model

RNG = np.random.default_rng(51)
W = RNG.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
F32 = np.float32


def _scalars(**values):
    return {k: np.array(v, F32) for k, v in values.items()}


#: name -> (nodes reading "c" and writing "y", extra constants, the table op, its attrs)
PATTERNS = {
    "silu": ([helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
              helper.make_node("Mul", ["c", "s"], ["y"], name="mul")], {}, "Swish",
             {"alpha": 1.0}),
    "silu-swapped": ([helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
                      helper.make_node("Mul", ["s", "c"], ["y"], name="mul")], {}, "Swish",
                     {"alpha": 1.0}),
    "x-hardsigmoid": ([helper.make_node("HardSigmoid", ["c"], ["s"], name="hs"),
                       helper.make_node("Mul", ["c", "s"], ["y"], name="mul")], {},
                      "XHardSigmoid", {"alpha": 0.2, "beta": 0.5}),
    "torch-hardswish": ([helper.make_node("HardSigmoid", ["c"], ["s"], name="hs",
                                          alpha=1 / 6, beta=0.5),
                         helper.make_node("Mul", ["c", "s"], ["y"], name="mul")], {},
                        "HardSwish", {}),
    "keras-hardswish": ([helper.make_node("Add", ["c", "three"], ["a"], name="add"),
                         helper.make_node("Clip", ["a", "zero", "six"], ["r"], name="relu6"),
                         helper.make_node("Mul", ["c", "r"], ["m"], name="mul"),
                         helper.make_node("Div", ["m", "six"], ["y"], name="div")],
                        _scalars(three=3, zero=0, six=6), "HardSwish", {}),
    "hardswish-gate": ([helper.make_node("Add", ["c", "three"], ["a"], name="add"),
                        helper.make_node("Clip", ["a", "zero", "six"], ["r"], name="relu6"),
                        helper.make_node("Mul", ["r", "sixth"], ["g"], name="scale"),
                        helper.make_node("Mul", ["g", "c"], ["y"], name="mul")],
                       _scalars(three=3, zero=0, six=6, sixth=1 / 6), "HardSwish", {}),
    "torch-gelu": ([helper.make_node("Div", ["c", "sqrt2"], ["d"], name="div"),
                    helper.make_node("Erf", ["d"], ["e"], name="erf"),
                    helper.make_node("Add", ["e", "one"], ["a"], name="add"),
                    helper.make_node("Mul", ["c", "a"], ["m"], name="mul"),
                    helper.make_node("Mul", ["m", "half"], ["y"], name="half")],
                   _scalars(sqrt2=math.sqrt(2), one=1, half=0.5), "Gelu",
                   {"approximate": "none"}),
    # PyTorch's gelu(approximate="tanh") before opset 20, as torch.onnx writes it
    "torch-gelu-tanh": ([helper.make_node("Mul", ["c", "c"], ["sq"], name="square"),
                         helper.make_node("Mul", ["c", "sq"], ["cube"], name="cube"),
                         helper.make_node("Mul", ["kappa", "cube"], ["k"], name="kappa_x3"),
                         helper.make_node("Add", ["c", "k"], ["s"], name="inner_sum"),
                         helper.make_node("Mul", ["beta", "s"], ["i"], name="inner"),
                         helper.make_node("Tanh", ["i"], ["t"], name="tanh"),
                         helper.make_node("Add", ["one", "t"], ["a"], name="add"),
                         helper.make_node("Mul", ["c", "a"], ["m"], name="mul"),
                         helper.make_node("Mul", ["half", "m"], ["y"], name="half")],
                        _scalars(kappa=0.044715, beta=math.sqrt(2 / math.pi), one=1, half=0.5),
                        "Gelu", {"approximate": "tanh"}),
    "gelu-tanh-pow": ([helper.make_node("Pow", ["c", "three"], ["cube"], name="cube"),
                       helper.make_node("Mul", ["cube", "kappa"], ["k"], name="kappa_x3"),
                       helper.make_node("Add", ["c", "k"], ["s"], name="inner_sum"),
                       helper.make_node("Mul", ["s", "beta"], ["i"], name="inner"),
                       helper.make_node("Tanh", ["i"], ["t"], name="tanh"),
                       helper.make_node("Add", ["t", "one"], ["a"], name="add"),
                       helper.make_node("Mul", ["c", "a"], ["m"], name="mul"),
                       helper.make_node("Mul", ["m", "half"], ["y"], name="half")],
                      _scalars(three=3, kappa=0.044715, beta=math.sqrt(2 / math.pi), one=1,
                               half=0.5), "Gelu", {"approximate": "tanh"}),
    "mish": ([helper.make_node("Softplus", ["c"], ["p"], name="softplus"),
              helper.make_node("Tanh", ["p"], ["t"], name="tanh"),
              helper.make_node("Mul", ["c", "t"], ["y"], name="mul")], {}, "Mish", {}),
}
NAMES = sorted(PATTERNS)


def model_of(name):
    nodes, consts, _, _ = PATTERNS[name]
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")
    return make_model([conv, *nodes], {"x": [1, 3, 5, 5]}, {"y": [1, 4, 5, 5]},
                      {"w": W, **consts}, opset=13)


@pytest.mark.parametrize("name", NAMES)
def test_pattern_is_one_table_operator_equal_to_onnxruntime(name):
    _, _, op, attrs = PATTERNS[name]
    model = model_of(name)
    graph = load_model(model)
    assert [(n.op, n.name) for n in graph.nodes][1:] == [(op, model.graph.node[-1].name)]
    assert dict(graph.nodes[1].attrs) == {**TABLE_OPS[op].defaults, **attrs}
    x = RNG.normal(0, 2, (3, 3, 5, 5)).astype(F32)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"], want, rtol=1e-5,
                               atol=1e-5)


def test_a_pattern_whose_inner_value_is_read_elsewhere_stays_as_written():
    """The Sigmoid's output is a graph output too: the Sigmoid and the Mul of two computed
    values stay as the model writes them (the Mul on the element-wise engine)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["y"], name="mul")]
    model = make_model(nodes, {"x": [1, 3, 5, 5]}, {"y": [1, 4, 5, 5], "s": [1, 4, 5, 5]},
                       {"w": W}, opset=13)
    assert [n.op for n in load_model(model).nodes] == ["Conv", "Sigmoid", "Eltwise"]


def test_other_constants_are_not_a_pattern():
    """x * (1 + erf(x / 2)) * 0.5 is not GELU (the divisor is not sqrt 2)."""
    nodes, consts, _, _ = PATTERNS["torch-gelu"]
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")
    model = make_model([conv, *nodes], {"x": [1, 3, 5, 5]}, {"y": [1, 4, 5, 5]},
                       {"w": W, **consts, "sqrt2": np.array(2.0, F32)}, opset=13)
    graph = load_model(model)               # no Gelu table: the Div runs on the host
    assert graph.meta["host_steps"]["div"]["at"] == "middle"
    assert "Div" in [n.op for n in graph.nodes]
    assert not any(n.op == "Gelu" for n in graph.nodes)


@pytest.mark.rtl
def test_fused_patterns_on_rtl(tmp_path):
    """Conv -> SiLU -> Conv -> GELU (PyTorch) -> Conv -> hard-swish (Keras): three tables in
    the three layers' post-processors; RTL equals golden, in the predicted cycles."""
    w2 = RNG.normal(0, 0.4, (4, 4, 3, 3)).astype(F32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["c1"], name="silu"),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Div", ["c2", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add1"),
             helper.make_node("Mul", ["c2", "a"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["g"], name="gelu"),
             helper.make_node("Conv", ["g", "w2"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
             helper.make_node("Add", ["c3", "three"], ["a3"], name="add3"),
             helper.make_node("Clip", ["a3", "zero", "six"], ["r"], name="relu6"),
             helper.make_node("Mul", ["c3", "r"], ["m3"], name="mul3"),
             helper.make_node("Div", ["m3", "six"], ["y"], name="hswish")]
    consts = _scalars(sqrt2=math.sqrt(2), one=1, half=0.5, three=3, zero=0, six=6)
    model = make_model(nodes, {"x": [1, 3, 5, 5]}, {"y": [1, 4, 5, 5]},
                       {"w": W, "w2": w2, **consts}, opset=13)
    calib = RNG.normal(0, 1, (16, 1, 3, 5, 5)).astype(F32)
    result = build(model, tmp_path / "build", calib={"x": calib}, log=lambda m: None)
    tables = [n.attrs["activation"] for n in result.graph.nodes if "table" in n.attrs]
    assert tables == ["Swish", "Gelu", "HardSwish"]
    inputs = {"x": RNG.normal(0, 1, (4, 1, 3, 5, 5)).astype(F32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * 4
