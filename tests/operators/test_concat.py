"""ONNX Concat along the channel axis: golden op, frontend mapping and refusals, quantization
(each source requantized into the output scale by its own multiplier), lowering, and the
golden model against onnxruntime on float Concat models."""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from hwonnx.api import build, simulate
from hwonnx.compiler import lower
from hwonnx.compiler.weights import unpack_tile
from hwonnx.isa import Op
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.golden import dequantize, evaluate, qconcat, quantize
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.quant import activation_params, quantize_graph
from ort_reference import reference_outputs
from helpers import raises
from spec_helpers import check_against_ort, make_model, ort_outputs, rand

ONE = (1 << 30, 30)          # mult, shift of the multiplier 1: the identity


def _refusal(name, reason):
    return raises(UnsupportedOperatorError, f"1 unsupported node(s): node '{name}' Concat "
                  f"(domain 'ai.onnx', opset 17) ({reason})")


# Golden op -----------------------------------------------------------------------------------

def test_qconcat_golden_by_hand():
    """Source 0 copied by the multiplier 1, source 1 halved (2**30 / 2**31), ties half up,
    then the output zero point and int8 saturation."""
    x0 = np.array([[[[5, -3]], [[127, -128]]]], np.int8)           # [1, 2, 1, 2], zp 1
    x1 = np.array([[[[3, -2]]]], np.int8)                          # [1, 1, 1, 2], zp -1
    mult = np.array([1 << 30, 1 << 30, 1 << 30], np.int32)
    shift = np.array([30, 30, 31], np.int32)
    y = qconcat(x0, x1, mult, shift, zps=(1, -1), out_zp=2, lo=-128, hi=127)
    # x0 - 1 = [4, -4], [126, -129]; + 2 -> [6, -2], [128 -> 127, -127]
    # (x1 + 1) / 2 = [2, -0.5] -> [2, 0] (half up); + 2 -> [4, 2]
    np.testing.assert_array_equal(y, np.array([[[[6, -2]], [[127, -127]], [[4, 2]]]]))
    assert y.dtype == np.int8


def test_qconcat_golden_clamps_a_fused_relu_and_reads_vectors():
    x0 = np.array([[-10, 10]], np.int8)
    x1 = np.array([[-128, 0, 5]], np.int8)
    mult, shift = np.full(5, ONE[0], np.int32), np.full(5, ONE[1], np.int32)
    y = qconcat(x0, x1, mult, shift, zps=(0, -128), out_zp=-5, lo=-5, hi=100)
    # x0 - 0 - 5 = [-15 -> -5, 5]; x1 + 128 - 5 = [-5, 123 -> 100, 128 -> 100]
    np.testing.assert_array_equal(y, [[-5, 5, -5, 100, 100]])


# Frontend ------------------------------------------------------------------------------------

def _branches(concat_inputs, axis=1, extra=(), out_shape=(1, 9, 4, 5)):
    """x -> Conv a (4 ch) and Conv b (5 ch) -> Concat(concat_inputs) -> extra."""
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", concat_inputs, ["c"], name="cat", axis=axis), *extra]
    out = extra[-1].output[0] if extra else "c"
    return make_model(nodes, {"x": [1, 3, 4, 5]}, {out: list(out_shape)},
                      {"wa": rand(4, 3, 1, 1, seed=1), "wb": rand(5, 3, 3, 3, seed=2)})


@pytest.mark.parametrize("axis", [1, -3])
def test_image_concat_along_channels(axis):
    graph = check_against_ort(_branches(["a", "b"], axis=axis), rtol=1e-4, atol=1e-5)
    node = graph.nodes[-1]
    assert (node.op, node.inputs, dict(node.attrs)) == (
        "Concat", ("a", "b"), {"axis": 1, "relu": False, "act_max": None})


def test_concat_of_three_with_a_repeated_input():
    graph = check_against_ort(_branches(["b", "a", "b"], out_shape=(1, 14, 4, 5)), rtol=1e-4,
                              atol=1e-5)
    assert graph.nodes[-1].inputs == ("b", "a", "b")


@pytest.mark.parametrize("axis", [1, -1])
def test_vector_concat_along_features(axis):
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["a"], name="fc1"),
             helper.make_node("Gemm", ["x", "w2"], ["b"], name="fc2"),
             helper.make_node("Concat", ["a", "x", "b"], ["y"], name="cat", axis=axis)]
    model = make_model(nodes, {"x": [1, 6]}, {"y": [1, 6 + 3 + 7]},
                       {"w1": rand(6, 3, seed=1), "w2": rand(6, 7, seed=2)})
    graph = check_against_ort(model, rtol=1e-4, atol=1e-5)
    assert [n.op for n in graph.nodes] == ["Dense", "Dense", "Concat"]


def test_relu_and_clip_after_concat_are_fused():
    relu = _branches(["a", "b"], extra=[helper.make_node("Relu", ["c"], ["r"], name="relu")])
    graph = check_against_ort(relu, rtol=1e-4, atol=1e-5)
    assert [(n.op, n.attrs.get("relu")) for n in graph.nodes] == [
        ("Conv", False), ("Conv", False), ("Concat", True)]
    clip = helper.make_node("Clip", ["c", "zero", "six"], ["r"], name="relu6")
    model = _branches(["a", "b"], extra=[clip])
    model.graph.initializer.extend([helper.make_tensor("zero", 1, [], [0.0]),
                                    helper.make_tensor("six", 1, [], [0.5])])
    graph = check_against_ort(model, rtol=1e-4, atol=1e-5)
    assert (graph.nodes[-1].op, graph.nodes[-1].attrs["relu"],
            graph.nodes[-1].attrs["act_max"]) == ("Concat", True, 0.5)


def test_single_input_concat_is_an_identity():
    graph = check_against_ort(_branches(["b"], out_shape=(1, 5, 4, 5)), rtol=1e-4, atol=1e-5)
    assert [(n.name, n.outputs) for n in graph.nodes] == [("conv_b", ("c",))]   # a is dead


@pytest.mark.parametrize("axis", [2, 3, -1])
def test_image_concat_along_height_or_width_is_a_concat_of_that_axis(axis):
    """(Lowered as one copy per source: tests/operators/test_slicing.py.)"""
    shape = {2: (1, 4, 8, 5), 3: (1, 4, 4, 10), -1: (1, 4, 4, 10)}[axis]
    graph = load_model(_branches(["a", "a"], axis=axis, out_shape=shape))
    (cat,) = [n for n in graph.nodes if n.op == "Concat"]
    assert cat.attrs["axis"] == axis % 4


def test_image_concat_along_the_batch_is_refused():
    model = _branches(["a", "a"], axis=0, out_shape=(2, 4, 4, 5))
    with _refusal("cat", (
            "Concat 'cat' along axis 0 (batch) has no hardware mapping; only the channel, "
            "height and width axes are supported")):
        load_model(model)


def test_vector_concat_along_the_batch_is_refused():
    nodes = [helper.make_node("Concat", ["x", "x"], ["y"], name="rows", axis=0)]
    model = make_model(nodes, {"x": [1, 6]}, {"y": [2, 6]})
    with _refusal("rows", (
            "Concat 'rows' along axis 0 (batch) has no hardware mapping; only the channel, "
            "height and width axes are supported")):
        load_model(model)


def test_concat_of_3d_values_is_refused():
    """Along the last axis of [1, T, D] tokens (along the tokens, axis 1, it is a Concat along
    the height of their image: below)."""
    nodes = [helper.make_node("Concat", ["x", "x"], ["y"], name="seq", axis=2)]
    model = make_model(nodes, {"x": [1, 3, 8]}, {"y": [1, 3, 16]})
    with _refusal("seq", (
            "Concat 'seq' joins values of shape [1, 3, 8]; only [1, C, H, W] images and "
            "[1, K] vectors can be concatenated")):
        load_model(model)


def test_concat_of_tokens_along_the_tokens_joins_the_heights_of_their_images():
    """[1, T, D] tokens joined along the tokens (issue 38): the images [1, D, T, 1] of the
    token view (hwonnx/frontend/tokens.py) joined along their height, on the array, between
    the host's views."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Concat", ["x", "r"], ["y"], name="seq", axis=-2)]
    graph = check_against_ort(make_model(nodes, {"x": [1, 3, 8]}, {"y": [1, 6, 8]}))
    seq = next(n for n in graph.nodes if n.name == "seq")
    assert (seq.op, seq.attrs["axis"], graph.types[seq.outputs[0]].shape) == (
        "Concat", 2, (1, 8, 6, 1))
    assert "seq" not in graph.meta["host_steps"]


def test_concat_with_a_constant_is_refused():
    nodes = [helper.make_node("Concat", ["x", "k"], ["y"], name="pad_k", axis=1)]
    model = make_model(nodes, {"x": [1, 6]}, {"y": [1, 8]}, {"k": rand(1, 2)})
    with _refusal("pad_k", (
            "Concat 'pad_k' joins the constant 'k' to values computed at run time; only "
            "run-time inputs can be concatenated")):
        load_model(model)


def test_concat_of_constants_is_still_folded():
    nodes = [helper.make_node("Concat", ["k1", "k2"], ["k"], name="fold", axis=1),
             helper.make_node("Add", ["x", "k"], ["y"], name="add")]
    model = make_model(nodes, {"x": [1, 5]}, {"y": [1, 5]},
                       {"k1": rand(1, 2, seed=1), "k2": rand(1, 3, seed=2)})
    graph = check_against_ort(model)
    assert [n.op for n in graph.nodes] == ["Add"]


def test_out_of_range_axis_is_a_model_error():
    nodes = [helper.make_node("Concat", ["x", "x"], ["y"], name="cat", axis=5)]
    model = make_model(nodes, {"x": [1, 6]}, {"y": [1, 12]})
    with pytest.raises(ModelError):
        load_model(model)


# Quantization and lowering -------------------------------------------------------------------

def _quantized(model, calib):
    graph = load_model(model)
    return graph, quantize_graph(graph, calib)


def test_shared_parameters_make_the_requantization_the_identity():
    """Concat(b, b): both sources share one scale and zero point, so the output takes them
    and every channel's multiplier is exactly 1: the output is the inputs' integers."""
    rng = np.random.default_rng(0)
    model = _branches(["b", "b"], out_shape=(1, 10, 4, 5))
    calib = {"x": rng.uniform(-1, 1, (16, 1, 3, 4, 5)).astype(np.float32)}
    _, qgraph = _quantized(model, calib)
    node = next(n for n in qgraph.nodes if n.op == "QConcat")
    b = next(n for n in qgraph.nodes if n.outputs == ("b:q",))
    assert node.attrs["zps"] == (b.attrs["out_zp"],) * 2
    assert node.attrs["out_scale"] == b.attrs["out_scale"]
    assert node.attrs["out_zp"] == b.attrs["out_zp"]
    assert np.all(qgraph.constants["cat:mult"] == ONE[0])
    assert np.all(qgraph.constants["cat:shift"] == ONE[1])
    env = evaluate(qgraph, {"x": calib["x"][:4, 0]}, keep_all=True)
    np.testing.assert_array_equal(env["c:q"], np.concatenate([env["b:q"]] * 2, axis=1))


def test_different_scales_get_their_own_multipliers():
    """Sources of different scales: the output range is the union of the calibrated input
    ranges, and output channel block j gets the multiplier s_j / s_out."""
    rng = np.random.default_rng(1)
    calib = {"x": rng.uniform(-1, 1, (16, 1, 3, 4, 5)).astype(np.float32)}
    graph, qgraph = _quantized(_branches(["a", "b"]), calib)
    node = next(n for n in qgraph.nodes if n.op == "QConcat")
    sa, sb = node.attrs["scales"]
    assert sa != sb
    values = evaluate_float(graph, {"x": calib["x"][:, 0]}, keep_all=True)
    union = activation_params(min(values["a"].min(), values["b"].min()),
                              max(values["a"].max(), values["b"].max()))
    assert (node.attrs["out_scale"], node.attrs["out_zp"]) == union
    real = np.concatenate([np.full(4, sa), np.full(5, sb)]) / union[0]
    mult, shift = qgraph.constants["cat:mult"], qgraph.constants["cat:shift"]
    assert np.all((mult >= 1 << 30) & (mult < 1 << 31))
    np.testing.assert_allclose(mult * np.exp2(-shift.astype(float)), real, rtol=2.0 ** -30)


def test_lowering_skips_the_zero_tiles():
    """On 8x8, Concat of 4 + 5 channels: N tile 0 (channels 0-7) reads one channel block of
    each source, N tile 1 (channel 8) only source b's: 3 MATMULs, not 4; weights are 1."""
    rng = np.random.default_rng(2)
    _, qgraph = _quantized(_branches(["a", "b"]),
                           {"x": rng.uniform(-1, 1, (8, 1, 3, 4, 5)).astype(np.float32)})
    program = lower(qgraph, ArchConfig())
    layer = next(layer for layer in program.layers if layer.op == "QConcat")
    assert layer.macs == 9 * 4 * 5
    index = program.layers.index(layer)
    matmuls = [i for i in program.expanded() if i["op"] == Op.MATMUL and i.layer == index]
    assert len(matmuls) == layer.tiles == 3
    placements = program.placements
    assert [m["act_addr"] for m in matmuls] == [placements["a:q"].base, placements["b:q"].base,
                                                placements["b:q"].base]
    for m in matmuls:       # copies: weights 0 and 1, four 2-bit ones per lane byte
        assert m["wpack"] == 2
        tile = program.images["wgt"][m["wgt_addr"]:m["wgt_addr"] + 2]
        assert set(np.unique(unpack_tile(tile, 2, program.config))) == {0, 1}


# Golden vs onnxruntime on float Concat models --------------------------------------------------

def _random_concat_model(rng):
    """2-4 graph inputs of random channel counts (images or vectors) and value ranges, joined
    along axis 1 (and maybe a fused Relu)."""
    count = int(rng.integers(2, 5))
    image = bool(rng.integers(2))
    h, w = (int(rng.integers(1, 6)), int(rng.integers(1, 6))) if image else (None, None)
    channels = [int(c) for c in rng.integers(1, 14, count)]
    shapes = {f"x{j}": [1, c, h, w] if image else [1, c] for j, c in enumerate(channels)}
    out = [1, sum(channels)] + ([h, w] if image else [])
    nodes = [helper.make_node("Concat", list(shapes), ["c"], name="cat", axis=1)]
    relu = bool(rng.integers(2))
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    model = make_model(nodes, shapes, {"y" if relu else "c": out})
    lows = rng.uniform(-4, 1, count)
    highs = lows + rng.uniform(0.5, 6, count)
    return model, shapes, lows, highs


@pytest.mark.parametrize("seed", range(12))
def test_golden_within_one_lsb_of_onnxruntime(seed):
    """Golden QConcat against onnxruntime's float Concat of the dequantized inputs, quantized
    with the output's parameters: within one output LSB (the rounding of ties and of the
    float32 products may differ), and within half an input step plus half an output step of
    onnxruntime on the raw float inputs."""
    rng = np.random.default_rng(seed)
    model, shapes, lows, highs = _random_concat_model(rng)
    samples = {name: rng.uniform(lo, hi, (32, *shape)).astype(np.float32)
               for (name, shape), lo, hi in zip(shapes.items(), lows, highs)}
    graph = load_model(model)
    qgraph = quantize_graph(graph, samples)
    feeds = {name: array[:, 0] for name, array in samples.items()}
    env = evaluate(qgraph, feeds, keep_all=True)
    out = graph.outputs[0]
    dq = next(n for n in qgraph.nodes if n.op == "Dequantize")
    s_out, zp_out = dq.attrs["scale"], dq.attrs["zero_point"]
    q_in = {n.inputs[0]: (env[n.outputs[0]], n.attrs["scale"], n.attrs["zero_point"])
            for n in qgraph.nodes if n.op == "Quantize"}
    worst, off_by_one, float_error, bound = 0, 0, 0.0, 0.0
    for i in range(32):
        dequantized = {name: dequantize(q[i:i + 1], scale=s, zero_point=z)
                       for name, (q, s, z) in q_in.items()}
        _, (expected,) = ort_outputs(model, dequantized)
        want = quantize(expected, scale=s_out, zero_point=zp_out).astype(int)
        got = env[dq.inputs[0]][i:i + 1].astype(int)
        diff = np.abs(got - want)
        worst, off_by_one = max(worst, int(diff.max())), off_by_one + int((diff > 0).sum())
        _, (raw,) = ort_outputs(model, {name: a[i] for name, a in samples.items()})
        float_error = max(float_error, float(np.abs(env[out][i:i + 1] - raw).max()))
    bound = max(s for _, s, _ in q_in.values()) / 2 + s_out / 2
    print(f"\nseed {seed}: {len(shapes)} inputs {list(shapes.values())}: max |golden - ort| "
          f"{worst} LSB ({off_by_one} element(s) off by one); vs float {float_error:.4g} "
          f"(bound {bound:.4g})")
    assert worst <= 1
    assert float_error <= bound * (1 + 1e-5)


def test_prequantized_qdq_concat_follows_onnxruntime(tmp_path):
    """onnxruntime's QDQ quantizer gives each Concat input its own scale: hwonnx uses them as
    they are (no calibration data) and the golden model stays within 1 LSB of onnxruntime's
    reference path (``ort_reference``) running the same quantized model."""
    rng = np.random.default_rng(3)
    data = rng.uniform(-1, 1, (48, 1, 3, 4, 5)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": x} for x in data[:32]])

        def get_next(self):
            return next(self.samples, None)

    onnx.save(_branches(["a", "b"]), tmp_path / "float.onnx")
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    result = build(tmp_path / "qdq.onnx", None, calib=None, verilog=False,
                   log=lambda message: None)
    node = next(n for n in result.graph.nodes if n.op == "QConcat")
    assert len(set(node.attrs["scales"])) == 2
    golden = simulate(result, {"x": data[32:]}, mode="golden").outputs["c"]
    reference = reference_outputs(tmp_path / "qdq.onnx", {"x": data[32:, 0]})[0]
    lsb = np.rint(np.abs(golden.reshape(reference.shape) - reference) / node.attrs["out_scale"])
    print(f"\nQDQ Concat: {int(np.count_nonzero(lsb))} of {lsb.size} values differ from "
          f"onnxruntime, at most {int(lsb.max())} LSB")
    assert lsb.max() <= 1
