"""Folding through layout (issue 13): BatchNormalization, Mul/Add by constants and the
activation after them fold into the preceding Conv/Gemm/MatMul through Squeeze, Unsqueeze,
Reshape and Transpose nodes that move only size-1 axes or that the fold can follow.

Each exporter pattern builds, its folded float graph has no BatchNorm left and a single
layer, and the golden int8 model stays within the quantization error bound of onnxruntime's
reference path on the same float input (:func:`error_bound`). A layout the fold cannot
follow, or a value a pre-quantized model rounds, leaves the graph as it was."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.ir.graph import Graph, Node, TensorType
from hwonnx.passes import FoldBatchNorm, FuseRelu, PassContext
from ort_reference import reference_session
from spec_helpers import make_model

SAMPLES = 24


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def bn_inits(rng, prefix, n):
    return {f"{prefix}_s": rng.uniform(0.5, 2, n).astype(np.float32) * rng.choice([-1, 1], n)
            .astype(np.float32), f"{prefix}_b": rand(rng, n), f"{prefix}_m": rand(rng, n),
            f"{prefix}_v": rng.uniform(0.2, 3, n).astype(np.float32)}


def bn_node(x, y, prefix="bn"):
    return helper.make_node("BatchNormalization",
                            [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y],
                            name=prefix, epsilon=1e-3)


def batchnorm1d_model(seed=0, k=12, n=10):
    """PyTorch ``Linear -> BatchNorm1d -> ReLU``: Gemm(transB) -> Unsqueeze(2) ->
    BatchNormalization -> Squeeze(2) -> Relu."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="fc", transB=1),
             helper.make_node("Unsqueeze", ["g", "axis2"], ["u"], name="unsqueeze"),
             bn_node("u", "n"),
             helper.make_node("Squeeze", ["n", "axis2"], ["q"], name="squeeze"),
             helper.make_node("Relu", ["q"], ["y"], name="relu")]
    return make_model(nodes, {"x": [1, k]}, {"y": [1, n]},
                      {"w": rand(rng, n, k), "b": rand(rng, n),
                       "axis2": np.array([2], np.int64), **bn_inits(rng, "bn", n)})


def keras_transpose_model(seed=1, k=9, n=7):
    """tf2onnx's BatchNormalization in NHWC: Dense reshaped to [1, 1, 1, N], Transpose to
    NCHW, BatchNormalization, Transpose back (a cancelling pair), Reshape, Relu."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="dense"),
             helper.make_node("Add", ["mm", "b"], ["d"], name="dense_bias"),
             helper.make_node("Reshape", ["d", "nhwc"], ["r"], name="to_4d"),
             helper.make_node("Transpose", ["r"], ["t"], name="to_nchw", perm=[0, 3, 1, 2]),
             bn_node("t", "n"),
             helper.make_node("Transpose", ["n"], ["t2"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t2", "flat"], ["f"], name="to_2d"),
             helper.make_node("Relu", ["f"], ["y"], name="relu")]
    return make_model(nodes, {"x": [1, k]}, {"y": [1, n]},
                      {"w": rand(rng, k, n), "b": rand(rng, n),
                       "nhwc": np.array([1, 1, 1, n], np.int64),
                       "flat": np.array([1, n], np.int64), **bn_inits(rng, "bn", n)})


def keras_mul_add_model(seed=2, k=8, n=6):
    """tf2onnx's BatchNormalization over the last axis of a Dense output: MatMul -> Add
    (bias) -> Mul -> Add by per-feature constants -> Relu."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="dense"),
             helper.make_node("Add", ["mm", "b"], ["d"], name="dense_bias"),
             helper.make_node("Mul", ["d", "gamma"], ["s"], name="bn_mul"),
             helper.make_node("Add", ["s", "beta"], ["a"], name="bn_add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return make_model(nodes, {"x": [1, k]}, {"y": [1, n]},
                      {"w": rand(rng, k, n), "b": rand(rng, n), "gamma": rand(rng, n),
                       "beta": rand(rng, 1, n)})


def conv_flatten_model(seed=3, c=3, m=5):
    """A Conv whose kernel covers its input ([1, M, 1, 1]), Reshape to [1, M] (moves only
    size-1 axes), Mul and Add by per-channel constants, BatchNormalization, Relu."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "flat"], ["r"], name="flatten"),
             helper.make_node("Mul", ["r", "gamma"], ["s"], name="scale"),
             helper.make_node("Add", ["s", "beta"], ["a"], name="shift"),
             bn_node("a", "n"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    return make_model(nodes, {"x": [1, c, 3, 3]}, {"y": [1, m]},
                      {"w": rand(rng, m, c, 3, 3), "b": rand(rng, m),
                       "flat": np.array([1, m], np.int64), "gamma": rand(rng, m),
                       "beta": rand(rng, m), **bn_inits(rng, "bn", m)})


def conv_reshape_model(seed=4, c=2, m=4, h=3, w=4, bn_shape=None, params=None):
    """Conv -> Reshape [1, M, H*W] (merges H and W, keeps the channel axis) ->
    BatchNormalization -> Reshape [1, M, H, W] -> Relu. ``bn_shape`` reshapes differently
    (a layout the fold may not follow); ``params`` replaces the BatchNorm parameters."""
    rng = np.random.default_rng(seed)
    bn_shape = bn_shape or (1, m, h * w)
    inits = {"w": rand(rng, m, c, 3, 3), "b": rand(rng, m),
             "to3d": np.array(bn_shape, np.int64), "to4d": np.array([1, m, h, w], np.int64),
             **(params or bn_inits(rng, "bn", bn_shape[1]))}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "to3d"], ["r"], name="to_3d"),
             bn_node("r", "n"),
             helper.make_node("Reshape", ["n", "to4d"], ["r4"], name="to_4d"),
             helper.make_node("Relu", ["r4"], ["y"], name="relu")]
    return make_model(nodes, {"x": [1, c, h, w]}, {"y": [1, m, h, w]}, inits)


PATTERNS = {"batchnorm1d": batchnorm1d_model, "keras_transpose_pair": keras_transpose_model,
            "keras_mul_add": keras_mul_add_model, "conv_flatten": conv_flatten_model,
            "conv_reshape": conv_reshape_model}


def error_bound(graph: Graph, int_graph: Graph, x: np.ndarray) -> np.ndarray:
    """The worst-case quantization error of the single folded layer of ``graph`` (Dense or
    Conv, ReLU after it), per output channel: the input's rounding through the weights
    (``s_in / 2 * sum |W|``), the weights' rounding (symmetric per channel, ``s_w = max |W| /
    127``) on the largest inputs (``s_w / 2 * taps * (max |x| + s_in / 2)``), the bias's
    rounding (``s_in * s_w / 2``) and the output's rounding (``s_out / 2``); the ReLU adds
    nothing (it is 1-Lipschitz)."""
    (layer,) = [n for n in graph.nodes if n.op in ("Conv", "Dense")]
    weight = graph.constants[layer.inputs[1]].astype(np.float64)
    if layer.op == "Dense":
        weight = weight.T                                   # [N, K]
    weight = weight.reshape(len(weight), -1)
    s_in = next(n for n in int_graph.nodes if n.op == "Quantize").attrs["scale"]
    s_out = next(n for n in int_graph.nodes if n.op == "Dequantize").attrs["scale"]
    s_w = np.abs(weight).max(axis=1) / 127
    taps = weight.shape[1]
    return (s_in / 2 * np.abs(weight).sum(axis=1) + s_w / 2 * taps * (np.abs(x).max() + s_in / 2)
            + s_in * s_w / 2 + s_out / 2)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_folds_and_golden_is_within_the_quantization_error_of_onnxruntime(name):
    model = PATTERNS[name]()
    graph = load_model(model)
    ops = [n.op for n in graph.nodes]
    assert "BatchNorm" not in ops
    assert [op for op in ops if op not in ("Reshape", "Flatten")] in (["Dense"], ["Conv"])
    assert all(n.attrs["relu"] for n in graph.nodes if n.op in ("Conv", "Dense"))
    # the folded float graph computes the model (float32 rounding only)
    rng = np.random.default_rng(11)
    shape = graph.types[graph.inputs[0]].shape
    x = rng.uniform(-1, 1, (SAMPLES, *shape)).astype(np.float32)
    session = reference_session(model)
    want = np.stack([session.run(None, {"x": sample})[0] for sample in x])
    folded = np.stack([evaluate_float(graph, {"x": sample})["y"] for sample in x])
    np.testing.assert_allclose(folded, want, rtol=1e-5, atol=1e-5)
    # the golden int8 model, from the same float input
    result = build(model, None, calib={"x": x}, verilog=False, log=lambda message: None)
    got = simulate(result, {"x": x}, mode="golden").outputs["y"].reshape(want.shape)
    bound = error_bound(graph, result.graph, x)
    channel_bound = bound.reshape((1, 1, -1) + (1,) * (want.ndim - 3))
    error = np.abs(got - want)
    s_out = next(n for n in result.graph.nodes if n.op == "Dequantize").attrs["scale"]
    print(f"\n{name}: max |golden - onnxruntime| {error.max():.4g} ({error.max() / s_out:.2f} "
          f"output LSB), bound per channel {bound.min():.4g}..{bound.max():.4g}")
    assert (error <= channel_bound * (1 + 1e-6)).all()


def test_a_layout_the_fold_cannot_follow_is_still_refused():
    """Conv [1, 2, 2, 2] -> Reshape [1, 4, 2]: BatchNorm channel j is row j % 2 of Conv
    channel j // 2. With parameters equal on the rows of each Conv channel the fold follows;
    with different ones the graph stays as it was and the BatchNorm is refused as before."""
    kwargs = {"c": 1, "m": 2, "h": 2, "w": 2, "bn_shape": (1, 4, 2)}
    rng = np.random.default_rng(5)
    params = {k: np.repeat(v, 2) for k, v in bn_inits(rng, "bn", 2).items()}
    graph = load_model(conv_reshape_model(params=params, **kwargs))
    assert [n.op for n in graph.nodes] == ["Conv", "Reshape", "Reshape"]
    calib = {"x": rng.uniform(-1, 1, (8, 1, 1, 2, 2)).astype(np.float32)}
    with pytest.raises(UnsupportedOperatorError) as error:
        build(conv_reshape_model(**kwargs), None, calib=calib, verilog=False,
              log=lambda message: None)
    assert str(error.value) == (
        "2 unsupported node(s): node 'bn' BatchNorm (not fused into a Conv/Gemm/MatMul) "
        "(domain 'ai.onnx', opset 17); node 'relu' Relu (not fused into a Conv/Gemm/MatMul) "
        "(domain 'ai.onnx', opset 17)")


def _ir_dense_bn_graph() -> Graph:
    """Dense [1, 4] -> Reshape [1, 4, 1] -> BatchNorm -> Reshape [1, 4] -> Relu, in the IR."""
    rng = np.random.default_rng(6)
    constants = {"w": rand(rng, 3, 4), "s": rand(rng, 4), "b": rand(rng, 4),
                 "m": rand(rng, 4), "v": rng.uniform(0.5, 2, 4).astype(np.float32)}
    shapes = {"x": (1, 3), "d": (1, 4), "u": (1, 4, 1), "n": (1, 4, 1), "q": (1, 4),
              "y": (1, 4)}
    types = {k: TensorType("float32", s) for k, s in shapes.items()}
    types.update({k: TensorType("float32", v.shape) for k, v in constants.items()})
    nodes = [Node("fc", "Dense", ("x", "w"), ("d",), {"relu": False, "act_max": None}),
             Node("unsq", "Reshape", ("d",), ("u",), {"shape": (1, 4, 1)}),
             Node("bn", "BatchNorm", ("u", "s", "b", "m", "v"), ("n",), {"epsilon": 1e-5}),
             Node("sq", "Reshape", ("n",), ("q",), {"shape": (1, 4)}),
             Node("relu", "Relu", ("q",), ("y",))]
    graph = Graph(nodes, ("x",), ("y",), types, constants)
    graph.verify()
    return graph


@pytest.mark.parametrize("quantized", ["d", "u"])
def test_a_value_the_model_quantizes_is_not_folded_across(quantized):
    """Without ``PassContext.quantized`` the BatchNorm and the Relu fold through the
    Reshapes; a pre-quantized model that rounds the Dense output or the reshaped value keeps
    both where they are."""
    graph = _ir_dense_bn_graph()
    folded = FuseRelu()(FoldBatchNorm()(graph, PassContext()), PassContext())
    assert [(n.op, n.outputs) for n in folded.nodes] == [
        ("Dense", ("d",)), ("Reshape", ("n",)), ("Reshape", ("y",))]
    assert folded.nodes[0].attrs["relu"]
    x = {"x": np.random.default_rng(0).standard_normal((1, 3)).astype(np.float32)}
    np.testing.assert_allclose(evaluate_float(folded, x)["y"], evaluate_float(graph, x)["y"],
                               rtol=1e-5, atol=1e-6)
    from hwonnx.passes import FoldScale        # (here: the module imports on older code)
    ctx = PassContext(quantized=frozenset({quantized}))
    assert FoldBatchNorm()(graph, ctx) is graph
    assert FuseRelu()(graph, ctx) is graph
    assert FoldScale()(graph, ctx) is graph


@pytest.mark.rtl
def test_batchnorm1d_runs_bit_exact_on_rtl(tmp_path):
    model = batchnorm1d_model()
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (SAMPLES, 1, 12)).astype(np.float32)
    build(model, tmp_path / "build", board="sim", calib={"x": x}, log=lambda message: None)
    inputs = {"x": rng.uniform(-1, 1, (6, 1, 12)).astype(np.float32)}
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda message: None)
    assert rtl.cycles == [rtl.predicted_cycles] * 6
    golden = simulate(tmp_path / "build", inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
