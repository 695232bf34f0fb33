"""MaxPool and GlobalMaxPool, and AveragePool with count_include_pad=0: the frontend's float op
against onnxruntime, the forms that are refused, and the quantized golden model against
onnxruntime on the float model (within the input's quantization error: the maximum of int8
values is exact; an average adds the output's rounding)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build, simulate
from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend import load_model
from rtl_helpers import cli_build_and_compare, he_weight, rtl_matches_golden
from spec_helpers import check_against_ort, make_model, ort_outputs


def pool_model(shape=(1, 3, 7, 8), op="MaxPool", **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    return make_model([node], {"x": list(shape)}, {"y": [None] * 4})


FORMS = {
    "3x3 s2 p1": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "2x2": dict(kernel_shape=[2, 2], strides=[2, 2]),
    "asymmetric pads": dict(kernel_shape=[3, 2], pads=[0, 1, 2, 0]),
    "dilated": dict(kernel_shape=[2, 3], dilations=[2, 1], pads=[1, 0, 1, 2]),
    "same_upper": dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower": dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
    # ceil_mode=1 (SqueezeNet's pools): test_maxpool_ceil_mode_is_end_padding
    "ceil 3x3 s2": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "ceil 3x3 s2 p1": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "ceil dilated": dict(kernel_shape=[2, 2], strides=[3, 2], dilations=[2, 1], ceil_mode=1),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_maxpool_float_op_equals_onnxruntime(form):
    graph = check_against_ort(pool_model(**FORMS[form]), rtol=0, atol=0)
    (node,) = graph.nodes
    assert node.op == "MaxPool"


def test_global_maxpool_float_op_equals_onnxruntime():
    graph = check_against_ort(pool_model(op="GlobalMaxPool"), rtol=0, atol=0)
    (node,) = graph.nodes
    assert (node.op, node.attrs["kernel"]) == ("MaxPool", (7, 8))


def test_relu_after_maxpool_fuses():
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[2, 2]),
             helper.make_node("Relu", ["p"], ["y"], name="relu")]
    graph = check_against_ort(make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [None] * 4}))
    (node,) = graph.nodes
    assert (node.op, node.attrs["relu"]) == ("MaxPool", True)


def test_maxpool_indices_output_is_refused():
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[2, 2])
    model = make_model([node], {"x": [1, 2, 4, 4]}, {"y": [None] * 4})
    model.graph.output.append(helper.make_tensor_value_info("i", TensorProto.INT64, [None] * 4))
    with pytest.raises(UnsupportedOperatorError, match="MaxPool 'pool' has an Indices output"):
        check_against_ort(model)


def test_maxpool_window_entirely_in_the_padding_is_refused():
    """Width 2, kernel 2 dilated by 3, one pad each side: the taps of the first window are
    at -1 and 2, both outside the input."""
    with pytest.raises(ModelError, match=r"MaxPool 'pool' has pads \[0, 1, 0, 1\]; with kernel "
                                         r"\[1, 2\] and dilations \[1, 3\] a window would lie"):
        check_against_ort(pool_model((1, 2, 3, 2), kernel_shape=[1, 2], dilations=[1, 3],
                                     pads=[0, 1, 0, 1]))


def test_maxpool_ceil_mode_is_end_padding():
    """ceil_mode=1 reads as more padding at the end, by hand: 8 columns, 3x3 stride 2:
    windows at 0, 2, 4, 6 (4 of them, 3 rounded down), the last reaching column 8, one past
    the input; padded 1 each side, windows at -1, 1, 3, 5, 7 (5, not 4), the last reaching
    column 9, two past. The 7 rows pad as they would with ceil_mode=0."""
    graph = check_against_ort(pool_model(**FORMS["ceil 3x3 s2"]), rtol=0, atol=0)
    assert graph.nodes[0].attrs["pads"] == (0, 0, 0, 1)
    graph = check_against_ort(pool_model(**FORMS["ceil 3x3 s2 p1"]), rtol=0, atol=0)
    assert graph.nodes[0].attrs["pads"] == (1, 1, 1, 2)


def test_maxpool_ceil_mode_with_a_window_in_the_end_padding_is_refused():
    """7 rows padded 1 each side, 2x2 stride 2, rounded up: windows at -1, 1, 3, 5 and 7, which
    starts in the end padding (the input ends at 6): onnxruntime drops it, ONNX's shape
    inference does not."""
    with pytest.raises(ModelError, match=r"^MaxPool 'pool' has ceil_mode=1 and its last window "
                                         r"along axis 2 would start in the end padding: ONNX's "
                                         r"shape inference gives 5 outputs there, onnxruntime "
                                         r"and ONNX's reference implementation 4; "):
        check_against_ort(pool_model(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
                                     ceil_mode=1))


@pytest.mark.parametrize("seed", range(4))
def test_quantized_maxpool_is_within_half_a_step_of_onnxruntime(seed, tmp_path):
    """Golden int8 model of input -> MaxPool -> Relu on random shapes: the only error is the
    input's rounding, so every output within the calibrated range is within half a
    quantization step of onnxruntime."""
    rng = np.random.default_rng(seed)
    c, h, w = (int(v) for v in rng.integers(1, 10, 3))
    k = (int(rng.integers(1, min(h, 3) + 1)), int(rng.integers(1, min(w, 3) + 1)))
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=list(k),
                              strides=[int(rng.integers(1, 3))] * 2, auto_pad="SAME_UPPER"),
             helper.make_node("Relu", ["p"], ["y"], name="relu")]
    model = make_model(nodes, {"x": [1, c, h, w]}, {"y": [None] * 4})
    calib = rng.normal(0, 1, (32, 1, c, h, w)).astype(np.float32)
    result = build(model, None, calib={"x": calib}, verilog=False, log=lambda m: None)
    assert [layer.op for layer in result.program.layers] == ["QMaxPool"]
    x = calib[:8]               # within the calibrated range: no clipping error
    got = simulate(result, {"x": x}, mode="golden").outputs["y"]
    want = np.concatenate([ort_outputs(model, {"x": sample})[1][0] for sample in x])
    scale = result.graph.nodes[0].attrs["scale"]
    error = np.abs(got.reshape(want.shape) - want).max()
    print(f"\nMaxPool {c}x{h}x{w} k{k}: max |golden - onnxruntime| {error:.4g} "
          f"(half a step: {scale / 2:.4g})")
    assert error <= scale / 2 * (1 + 1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_average_pool_excluding_padding_is_within_its_quantization_error(seed):
    """count_include_pad=0 with padding: each window divides by its own number of real
    pixels, so the border outputs stay averages; within half an input step (the inputs'
    rounding, averaged) plus half an output step of onnxruntime, plus the 31-bit
    multiplier's relative error."""
    rng = np.random.default_rng(seed)
    c, h, w = (int(v) for v in rng.integers(2, 8, 3))
    k = (int(rng.integers(2, min(h, 3) + 1)), int(rng.integers(2, min(w, 3) + 1)))
    model = pool_model((1, c, h, w), op="AveragePool", kernel_shape=list(k),
                       pads=[k[0] - 1, k[1] - 1, k[0] - 1, 0], count_include_pad=0)
    calib = rng.normal(0, 1, (32, 1, c, h, w)).astype(np.float32)
    result = build(model, None, calib={"x": calib}, verilog=False, log=lambda m: None)
    (pool,) = [n for n in result.graph.nodes if n.op == "QAvgPool"]
    assert pool.attrs["count_include_pad"] is False
    got = simulate(result, {"x": calib[:8]}, mode="golden").outputs["y"]
    want = np.concatenate([ort_outputs(model, {"x": sample})[1][0] for sample in calib[:8]])
    s_in = result.graph.nodes[0].attrs["scale"]
    s_out = result.graph.nodes[-1].attrs["scale"]
    error = np.abs(got.reshape(want.shape) - want).max()
    bound = s_in / 2 + s_out / 2 + np.abs(want).max() * 2 ** -30
    print(f"\nAveragePool {c}x{h}x{w} k{k} excluding padding: max |golden - onnxruntime| "
          f"{error:.4g}, bound {bound:.4g}")
    assert error <= bound


@pytest.mark.rtl
def test_squeezenet_pools_with_ceil_mode_run_bit_exact_through_the_cli(tmp_path, capsys):
    """A SqueezeNet-shaped front as torch.onnx writes it: Conv 3x3 -> Relu -> MaxPool 3x3
    stride 2 ceil_mode=1 (14x14 -> 7x7, where ceil_mode=0 gives 6x6) -> Conv 1x1 -> Relu ->
    MaxPool ceil_mode=1 (7x7 -> 3x3); ``hwonnx build`` then ``hwonnx sim --compare``: RTL
    equal to golden bit for bit in the predicted cycles, and within 5% of the output range
    of onnxruntime's float model (measured: 1%, 0.034 of 3.42)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("MaxPool", ["r0"], ["p0"], name="pool0", kernel_shape=[3, 3],
                              strides=[2, 2], ceil_mode=1),
             helper.make_node("Conv", ["p0", "w1"], ["c1"], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["y"], name="pool1", kernel_shape=[3, 3],
                              strides=[2, 2], ceil_mode=1)]
    model = make_model(nodes, {"x": [1, 3, 16, 16]}, {"y": [1, 8, 3, 3]})
    model.graph.initializer.extend([
        numpy_helper.from_array(he_weight(rng, 8, 3, 3, 3), "w0"),
        numpy_helper.from_array(he_weight(rng, 8, 8, 1, 1), "w1")])
    x = rng.random((10, 1, 3, 16, 16)).astype(np.float32)
    got = cli_build_and_compare(tmp_path, capsys, model, x).reshape(2, 8, 3, 3)
    want = np.concatenate([ort_outputs(model, {"x": sample})[1][0] for sample in x[8:]])
    print(f"\nSqueezeNet front, ceil_mode pools: max |RTL - onnxruntime float| "
          f"{np.abs(got - want).max():.4g} of an output range {np.ptp(want):.4g}")
    assert np.abs(got - want).max() <= 0.05 * np.ptp(want)


def _reduce_model(op, axes, keepdims=1, opset=17, shape=(1, 6, 5, 7)):
    """``op`` over ``axes`` of x, as an attribute (opset < 18) or an input (opset 18)."""
    inputs, inits = ["x"], []
    attrs = {"keepdims": keepdims}
    if opset >= 18:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    else:
        attrs["axes"] = axes
    model = make_model([helper.make_node(op, inputs, ["y"], name="reduce", **attrs)],
                       {"x": list(shape)}, {"y": [None] * (4 if keepdims else 4 - len(axes))},
                       opset=opset)
    model.graph.initializer.extend(inits)
    return model


@pytest.mark.parametrize("op, axes, opset", [("ReduceMean", [2, 3], 17),
                                             ("ReduceMean", [-1, -2], 18),
                                             ("ReduceMax", [3, 2], 17),
                                             ("ReduceMax", [2, -1], 18)])
def test_reduce_over_height_and_width_is_a_global_pool(op, axes, opset):
    """timm's squeeze-and-excitation blocks: ReduceMean over H and W, dimensions kept (and
    ReduceMax, the same reduction), axes as an attribute or, from opset 18, an input."""
    graph = check_against_ort(_reduce_model(op, axes, opset=opset), rtol=1e-5, atol=1e-6)
    (node,) = graph.nodes
    assert (node.op, node.attrs["kernel"]) == (
        "AvgPool" if op == "ReduceMean" else "MaxPool", (5, 7))


@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([1], 0), ([1, 2, 3], 1)])
def test_other_reductions_are_refused_naming_the_form(axes, keepdims):
    with pytest.raises(UnsupportedOperatorError,
                       match=rf"ReduceMean 'reduce' reduces axes \[{', '.join(map(str, axes))}\]"
                             rf" of \[1, 6, 5, 7\]; the array reduces height and width"):
        load_model(_reduce_model("ReduceMean", axes, keepdims))


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
def test_reduce_without_kept_dims_is_a_global_pool_and_a_reshape(op):
    """ShuffleNet's last ReduceMean (axes [2, 3], keepdims=0): [1, C, H, W] -> [1, C]."""
    graph = check_against_ort(_reduce_model(op, [2, 3], keepdims=0), rtol=1e-5, atol=1e-6)
    assert [node.op for node in graph.nodes] == [
        "AvgPool" if op == "ReduceMean" else "MaxPool", "Reshape"]
    assert graph.types[graph.outputs[0]].shape == (1, 6)


@pytest.mark.rtl
def test_squeeze_and_excitation_block_runs_bit_exact(tmp_path):
    """A timm squeeze-and-excitation block: x -> ReduceMean(H, W, keepdims) -> 1x1 Conv ->
    Relu -> 1x1 Conv -> Sigmoid -> Mul with x; RTL equal to golden in the predicted cycles."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="se_mean", axes=[2, 3],
                              keepdims=1),
             helper.make_node("Conv", ["m", "w0"], ["c0"], name="se_reduce"),
             helper.make_node("Relu", ["c0"], ["r0"], name="se_relu"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="se_expand"),
             helper.make_node("Sigmoid", ["c1"], ["g"], name="se_gate"),
             helper.make_node("Mul", ["x", "g"], ["y"], name="se_scale")]
    model = make_model(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]})
    model.graph.initializer.extend([
        numpy_helper.from_array(he_weight(rng, 4, 8, 1, 1), "w0"),
        numpy_helper.from_array(he_weight(rng, 8, 4, 1, 1), "w1")])
    x = rng.normal(0, 1, (10, 1, 8, 6, 6)).astype(np.float32)
    result = build(model, None, calib={"x": x[:8]}, log=lambda m: None)
    assert "QAvgPool" in [layer.op for layer in result.program.layers]
    rtl_matches_golden(result, {"x": x[8:]}, 2)
