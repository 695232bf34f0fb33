"""LayerNormalization on the host (issue 38, until its engine exists): between accelerator
segments and at the end of the graph, in float32 NumPy (``hwonnx.golden.host``), against
onnxruntime's reference path on the very values it reads; its forms refused by name."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build, simulate
from hwonnx.compiler.timing import predict
from hwonnx.errors import ModelError
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate
from hwonnx.ir.evaluate import evaluate_float

from ort_reference import reference_outputs
from tests.host_steps.test_segments import quiet


def ln_model(rng, *, end=False, axis=-1, shape=(1, 16), runtime_scale=False, mean_out=False):
    """x -> Gemm -> LayerNormalization (-> Gemm unless ``end``); ``shape``: x's shape (a
    [1, C, H, W] image goes through a 1x1 Conv instead)."""
    c = shape[1]
    image = len(shape) == 4
    first = helper.make_node("Conv", ["x", "w1"], ["h"], name="conv", kernel_shape=[1, 1]) \
        if image else helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1")
    ln_out = "y" if end else "n"
    ln = helper.make_node("LayerNormalization", ["h", "r" if runtime_scale else "gamma", "beta"],
                          [ln_out, "mean"] if mean_out else [ln_out], name="/norm/LayerNorm",
                          axis=axis, epsilon=1e-5)
    nodes = [first, ln]
    inits = {"w1": rng.normal(0, 0.5, (c, c, 1, 1) if image else (c, c)),
             "b1": rng.normal(0, 0.5, c), "gamma": rng.normal(1, 0.3, shape[axis:] if axis
                                                               != -1 else shape[-1:]),
             "beta": rng.normal(0, 0.2, shape[axis:] if axis != -1 else shape[-1:])}
    if runtime_scale:
        nodes.insert(1, helper.make_node("Relu", ["h"], ["r"], name="relu"))
    if not end:
        nodes.append(helper.make_node("Gemm", ["n", "w2"], ["y"], name="fc2"))
        inits["w2"] = rng.normal(0, 0.5, (c, 4))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                             list(shape) if end else [1, 4])]
    if mean_out:
        outputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT,
                                                     list(shape[:axis]) + [1] * -axis))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        outputs, [numpy_helper.from_array(np.asarray(v, np.float32), k)
                  for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("end, axis, shape", [(False, -1, (1, 16)), (True, -1, (1, 16)),
                                              (True, 1, (1, 4, 3, 3)), (True, 2, (1, 4, 3, 3))])
def test_float_layernorm_on_the_host_equals_onnxruntime(end, axis, shape):
    rng = np.random.default_rng(len(shape) + axis)
    model = ln_model(rng, end=end, axis=axis, shape=shape)
    graph = load_model(model)
    assert graph.meta["host_steps"]["/norm/LayerNorm"]["at"] == ("end" if end else "middle")
    x = rng.normal(size=shape).astype(np.float32)
    np.testing.assert_allclose(evaluate_float(graph, {"x": x})["y"],
                               reference_outputs(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_layernorm_between_segments_runs_on_its_golden_inputs_as_onnxruntime(tmp_path):
    rng = np.random.default_rng(38)
    model = ln_model(rng)
    calib = {"x": rng.uniform(-1, 1, (32, 16)).astype(np.float32)}
    result = build(model, tmp_path / "out", calib=calib, log=quiet, verilog=False)
    assert len(result.segments) == 2
    env = evaluate(result.graph, {"x": calib["x"]}, keep_all=True)
    alone = ln_model(rng, end=True)                        # the same node, read from h
    del alone.graph.node[0]
    del alone.graph.input[:]
    alone.graph.input.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 16]))
    for name in ("gamma", "beta"):
        source = next(i for i in model.graph.initializer if i.name == name)
        next(i for i in alone.graph.initializer if i.name == name).CopyFrom(source)
    for sample in range(32):
        want = reference_outputs(alone, {"h": env["h"][sample:sample + 1]})[0]
        np.testing.assert_allclose(env["n"][sample:sample + 1], want, rtol=1e-5, atol=1e-6)


@pytest.mark.rtl
def test_layernorm_between_segments_on_the_rtl(tmp_path):
    """Both segments around the host LayerNorm on the 8x8 RTL: every value equal to golden,
    every segment in its predicted cycles."""
    rng = np.random.default_rng(17)
    calib = {"x": rng.uniform(-1, 1, (16, 16)).astype(np.float32)}
    result = build(ln_model(rng), tmp_path / "out", calib=calib, log=quiet, verilog=False)
    rtl = simulate(result, {"x": calib["x"][:3]}, mode="compare", log=quiet)
    predicted = [predict(p.expanded(), p.config).total for p in result.segments]
    assert len(predicted) == 2 and rtl.segment_cycles == [[p] * 3 for p in predicted]


@pytest.mark.parametrize("kwargs, message", [
    (dict(runtime_scale=True), "LayerNormalization '/norm/LayerNorm' needs a constant scale, "
                               "but 'r' is computed at run time"),
    (dict(mean_out=True, end=True), "LayerNormalization '/norm/LayerNorm' output 'mean' (a "
                                    "statistic) must be unused"),
    (dict(axis=0, end=True), "LayerNormalization '/norm/LayerNorm' normalizes over the batch "
                             "axis"),
])
def test_layernorm_forms_the_host_does_not_run_are_refused_by_name(kwargs, message):
    with pytest.raises(ModelError, match="^" + re.escape(message) + "$"):
        load_model(ln_model(np.random.default_rng(0), **kwargs))
