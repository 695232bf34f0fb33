"""Shared helpers of the ONNX IR conformance tests (``tests/frontend/test_spec_*.py``): build small
models with onnx.helper, compare hwonnx's reading with onnxruntime. ``raises`` (a message
matched exactly) is in ``helpers.py``."""

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float

__all__ = ["rand", "make_model", "ort_outputs", "check_against_ort", "relu_model",
           "FLOAT", "SUPPORTED"]

FLOAT = TensorProto.FLOAT
SUPPORTED = ("supported operators are Abs, Add, AveragePool, BatchNormalization, Ceil, Celu, "
             "Clip, Concat, Conv, ConvTranspose, DepthToSpace, Dropout, Elu, Erf, Exp, Flatten, "
             "Floor, Gather, Gelu, "
             "Gemm, GlobalAveragePool, GlobalMaxPool, HardSigmoid, HardSwish, Identity, "
             "LeakyRelu, Log, MatMul, Max, MaxPool, Mean, Min, Mish, Mul, Neg, PRelu, Pad, "
             "Reciprocal, ReduceMax, ReduceMean, Relu, Reshape, Resize, Round, Selu, Sigmoid, "
             "Sign, "
             "Slice, Softplus, Softsign, "
             "Split, Sqrt, Squeeze, Sum, Swish, Tanh, ThresholdedRelu, Transpose, Unsqueeze, "
             "Upsample"
             # the host steps without a hardware mapping (hwonnx.frontend.host)
             "; on the host also Cast, Div, Sub at the start of the graph, ArgMax, "
             "LayerNormalization, LogSoftmax, Softmax, TopK at the end and ArgMax, Cast, Div, "
             "LayerNormalization, LogSoftmax, Softmax, Sub, TopK between accelerator segments")


def rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)


def make_model(nodes, inputs, outputs, inits=None, opset=17, elem=FLOAT, opsets=None, ir=8,
               out_elem=None, **kw):
    """``inputs``/``outputs`` map names to shapes (``None`` entries are unknown dims)."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, out_elem or elem, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, ir_version=ir, opset_imports=opsets or [
        helper.make_opsetid("", opset)], **kw)


def relu_model(**kw):
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [1, 4]},
                      {"y": [1, 4]}, **kw)


def ort_outputs(model, feeds):
    """Run ``model`` (a ModelProto or a path) on onnxruntime's CPU provider."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    inputs = {}
    for i in session.get_inputs():
        if i.name in feeds:
            dtype = {"tensor(double)": np.float64, "tensor(float16)": np.float16}.get(
                i.type, np.float32)
            inputs[i.name] = feeds[i.name].astype(dtype)
    return [o.name for o in session.get_outputs()], session.run(None, inputs)


def check_against_ort(model, source=None, *, seed=3, rtol=1e-3, atol=1e-4, **load_args):
    """Load ``source`` (default: ``model``) with hwonnx, evaluate the float graph and compare
    every output with onnxruntime running ``model``; return the graph."""
    graph = load_model(model if source is None else source, **load_args)
    feeds = {name: rand(*graph.types[name].shape, seed=seed) for name in graph.inputs}
    names, expected = ort_outputs(model, feeds)
    got = evaluate_float(graph, feeds)
    assert names == list(graph.outputs)
    for name, value in zip(names, expected):
        np.testing.assert_allclose(got[name], value.astype(np.float32), rtol=rtol, atol=atol)
    return graph
