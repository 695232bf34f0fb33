"""Token-wise layers ([1, ..., T, D]: transformers) as 1x1 convolutions over the tokens viewed as
the pixels of an image [1, D, T, 1] (hwonnx/frontend/tokens.py): the float graph against
onnxruntime on the region's edge forms (a 4-D input, a region value that is also a graph output,
a per-channel scale, a per-token constant the host adds, a weight two MatMuls share), a
pre-norm block whose LayerNormalization runs on the host between segments (its views on the
host too; golden against the float model stage by stage), and an onnxruntime QDQ model built
with its own parameters against its reference path. The exporter-shaped ViT MLP block is
tests/end_to_end/test_transformer_mlp.py."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from helpers import quiet
from hwonnx import api
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_outputs
from rtl_helpers import rtl_matches_golden
from spec_helpers import make_model

ort.set_default_logger_severity(3)
F32 = np.float32
T, D = 6, 12


def _w(rng, *shape, s=0.3):
    return rng.normal(0, s, shape).astype(F32)


def edges() -> onnx.ModelProto:
    """``x`` [1, 1, T, D] -> MatMul -> Add bias -> Mul by a per-channel constant -> Tanh ->
    (``h``, also a graph output) -> MatMul (the same weight as the first: ``w`` is [D, D]) ->
    Dropout -> Add a per-token constant [T, D] (a host step) -> Relu -> Add ``x`` = ``y``."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="fc1"),
             helper.make_node("Add", ["a", "b"], ["ab"], name="bias"),
             helper.make_node("Mul", ["s", "ab"], ["m"], name="scale"),
             helper.make_node("Tanh", ["m"], ["h"], name="tanh"),
             helper.make_node("MatMul", ["h", "w"], ["f"], name="fc2"),
             helper.make_node("Dropout", ["f"], ["d"], name="drop"),
             helper.make_node("Add", ["d", "pos"], ["p"], name="pos_add"),
             helper.make_node("Relu", ["p"], ["r"], name="relu"),
             helper.make_node("Add", ["x", "r"], ["y"], name="residual")]
    return make_model(nodes, {"x": [1, 1, T, D]}, {"y": [1, 1, T, D], "h": [1, 1, T, D]},
                      {"w": _w(rng, D, D), "b": _w(rng, D, s=0.1),
                       "s": rng.uniform(0.5, 1.5, D).astype(F32), "pos": _w(rng, T, D)})


def prenorm() -> onnx.ModelProto:
    """A pre-norm transformer MLP half-block: ``y = x + fc2(relu(fc1(LayerNorm(x))))``."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "beta"], ["n"], name="norm",
                              axis=-1),
             helper.make_node("MatMul", ["n", "w1"], ["a"], name="fc1"),
             helper.make_node("Add", ["b1", "a"], ["h"], name="fc1_bias"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["f"], name="fc2"),
             helper.make_node("Add", ["f", "b2"], ["fb"], name="fc2_bias"),
             helper.make_node("Add", ["x", "fb"], ["y"], name="residual")]
    return make_model(nodes, {"x": [1, T, D]}, {"y": [1, T, D]},
                      {"g": rng.uniform(0.5, 1.5, D).astype(F32), "beta": _w(rng, D, s=0.1),
                       "w1": _w(rng, D, 2 * D), "b1": _w(rng, 2 * D, s=0.1),
                       "w2": _w(rng, 2 * D, D), "b2": _w(rng, D, s=0.1)})


def _samples(seed: int, count: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (count, *shape[1:])).astype(F32)


def _onnxruntime(model, x) -> "list[np.ndarray]":
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [session.run(None, {"x": sample[None]}) for sample in x]
    return [np.concatenate([run[i] for run in runs]) for i in range(len(runs[0]))]


@pytest.mark.parametrize("make", [edges, prenorm])
def test_float_graph_computes_the_model(make):
    """The float graph keeps the model's input and output shapes and computes its function;
    the MatMuls are 1x1 Convs on [1, D, T, 1] images."""
    model = make()
    graph = load_model(model)
    shape = graph.types["x"].shape
    x = _samples(3, 8, shape)
    got = evaluate_float(graph, {"x": x})
    for name, want in zip([o.name for o in model.graph.output], _onnxruntime(model, x)):
        assert got[name].shape == want.shape
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)
    convs = [n for n in graph.nodes if n.name.startswith("fc")]
    assert [n.op for n in convs] == ["Conv", "Conv"]
    assert all(graph.types[n.inputs[0]].shape[::3] == (1, 1) for n in convs)


def test_edges_of_a_token_region():
    """``x`` [1, 1, T, D] is viewed on the host; ``h``, read inside and returned, is given
    back its tokens on the host; the weight both MatMuls read is transposed once (fc1 then
    takes the per-channel scale into its own copy); the per-token constant is a host step
    between segments, in the image layout ([1, D, T, 1]); the Dropout is gone."""
    graph = load_model(edges())
    steps = graph.meta["host_steps"]
    assert {k: v["at"] for k, v in steps.items()} == {
        "x_rows_view": "start", "x_image_view": "start", "h_rows_view": "end",
        "h_view": "end", "y_rows_view": "end", "y_view": "end"}
    assert steps["x_image_view"]["why"] == (
        "Transpose views the tokens [1, 1, 6, 12] as the pixels of an image [1, 12, 6, 1], "
        "which the array reads; at the start of the graph, before the accelerator's input")
    assert steps["h_rows_view"]["why"] == (
        "Transpose gives the image [1, 12, 6, 1] back its tokens [1, 1, 6, 12]; at the end of "
        "the graph, after the accelerator's output")
    fc1, fc2 = (next(n for n in graph.nodes if n.name == name) for name in ("fc1", "fc2"))
    inits = {i.name: numpy_helper.to_array(i) for i in edges().graph.initializer}
    assert fc2.inputs[1] == "w_image"                       # [D, D] transposed, once
    np.testing.assert_array_equal(graph.constants["w_image"][:, :, 0, 0], inits["w"].T)
    np.testing.assert_allclose(graph.constants[fc1.inputs[1]][:, :, 0, 0],      # the scale
                               inits["w"].T * inits["s"][:, None], rtol=1e-6)
    assert [n.op for n in graph.nodes if not n.name.endswith("_view")] == [
        "Conv", "Tanh", "Conv", "Add", "Add"]
    pos = next(n for n in graph.nodes if n.name == "pos_add")
    assert pos.attrs["relu"]                                  # the Relu fused into it
    np.testing.assert_array_equal(graph.constants[pos.inputs[1]][0, :, :, 0], inits["pos"].T)
    result = api.build(edges(), None, calib={"x": _samples(4, 16, (1, 1, T, D))},
                       verilog=False, log=quiet)
    assert result.graph.meta["host_steps"]["pos_add"]["at"] == "middle"
    assert len(result.graph.meta["segments"]) == 2


def test_prenorm_block_runs_the_layernorm_and_its_views_on_the_host():
    """LayerNormalization is a host step; so are the views next to it (of its result, and of
    ``x``, which it reads too): the accelerator reads the images [1, D, T, 1], no rank-3
    value; the integer graph has one segment."""
    graph = load_model(prenorm())
    steps = {k: v["at"] for k, v in graph.meta["host_steps"].items()}
    assert steps == {"norm": "middle", "n_rows_view": "middle", "n_image_view": "middle",
                     "x_rows_view": "middle", "x_image_view": "middle", "y_rows_view": "end",
                     "y_view": "end"}
    assert graph.meta["host_steps"]["n_image_view"]["why"] == (
        "Transpose views the tokens [1, 6, 12] as the pixels of an image [1, 12, 6, 1], which "
        "the array reads (it reads the host value 'n_rows'); between accelerator segments: the "
        "host reads its input back and writes its result, quantized, into the next segment")
    result = api.build(prenorm(), None, calib={"x": _samples(4, 64, (1, T, D))},
                       verilog=False, log=quiet)
    quantized = [n for n in result.graph.nodes if n.op == "Quantize"]
    assert [(n.inputs[0], result.graph.types[n.outputs[0]].shape) for n in quantized] == [
        ("n_image", (1, D, T, 1)), ("x_image", (1, D, T, 1))]
    assert [n.op for n in result.graph.nodes if n.op.startswith("Q")] == [
        "Quantize", "Quantize", "QConv", "QConv", "QEltwise"]


def test_prenorm_golden_within_each_stages_rounding_of_the_float_model():
    """On the calibration samples (their ranges cover every value), each stage of the golden
    model against onnxruntime on the float model, from the golden model's own int8 inputs
    (as tests/end_to_end/test_transformer_mlp.py): the quantized LayerNorm result ``n`` and
    ``x`` within half a step; the ReLU layer ``r`` within ``s_r / 2 + |r_acc - r|`` (ReLU
    has slope 1), ``r_acc`` the exact value of its int32 accumulator; ``f`` within
    ``s_f / 2 + |f_acc - f|``; ``y`` within ``s_y / 2 + 255 max(s_x, s_f) / 2**16 +
    |x_q - x| + |f_q - f|``; each plus 1e-3 of a step for float32."""
    model = prenorm()
    x = _samples(5, 64, (1, T, D))
    result = api.build(model, None, calib={"x": x}, verilog=False, log=quiet)
    q = {n.op: n for n in result.graph.nodes}
    fc1, fc2 = (n for n in result.graph.nodes if n.op == "QConv")
    add = q["QEltwise"]
    params = {"n": (fc1.attrs["in_scale"], fc1.attrs["in_zp"]),
              "x": (add.attrs["a_scale"], add.attrs["za"]),
              "r": (fc2.attrs["in_scale"], fc2.attrs["in_zp"]),
              "f": (fc2.attrs["out_scale"], fc2.attrs["out_zp"]),
              "y": (add.attrs["out_scale"], add.attrs["out_zp"])}
    env = evaluate(result.graph, {"x": x}, keep_all=True)

    def rows(value):                          # [S, K, T, 1] images -> [S T, K]
        image = env[value].astype(np.int64)
        return image[..., 0].transpose(0, 2, 1).reshape(-1, image.shape[1])

    golden = {"n": rows(fc1.inputs[0]), "x": rows(add.inputs[0]), "r": rows(fc1.outputs[0]),
              "f": rows(fc2.outputs[0]), "y": rows(add.outputs[0])}
    got = {k: (v.astype(np.float64) - params[k][1]) * params[k][0] for k, v in golden.items()}
    export = prenorm()
    for value in ("n", "r", "fb"):
        export.graph.output.append(helper.make_tensor_value_info(value, onnx.TensorProto.FLOAT,
                                                                 None))
    y, n, r, f = (v.reshape(-1, v.shape[-1]).astype(np.float64)
                  for v in _onnxruntime(export, x))
    want = {"n": n, "x": x.reshape(-1, D).astype(np.float64), "r": r, "f": f, "y": y}

    def acc(layer, source, name):
        """The layer's exact pre-activation from its int8 input: int32 sum times the scales."""
        w = result.graph.constants[layer.inputs[1]][:, :, 0, 0].astype(np.int64).T
        bias = result.graph.constants[layer.inputs[2]].astype(np.int64)
        s_w = np.abs(numpy_helper.to_array(next(i for i in model.graph.initializer
                                                if i.name == name)).astype(np.float64)
                     ).max(axis=0) / 127
        return ((golden[source] - params[source][1]) @ w + bias) * (params[source][0] * s_w)

    errors = {k: np.abs(got[k] - want[k]) for k in got}
    bounds = {"n": np.full_like(n, params["n"][0] / 2), "x": np.full_like(n, params["x"][0] / 2),
              "r": params["r"][0] / 2 + np.abs(np.maximum(acc(fc1, "n", "w1"), 0) - r),
              "f": params["f"][0] / 2 + np.abs(acc(fc2, "r", "w2") - f),
              "y": params["y"][0] / 2 + 255 * max(params["x"][0], params["f"][0]) / 2 ** 16
              + errors["x"] + errors["f"]}
    report = []
    for key, bound in bounds.items():
        step = params[key][0]
        report.append(f"{key} {errors[key].max() / step:.3f} LSB (bound {bound.max() / step:.3f}"
                      f" LSB at most; error/bound {(errors[key] / bound).max():.2f} at most)")
        assert np.all(errors[key] <= bound + 1e-3 * step), report[-1]
    print("\nprenorm block: golden - float model: " + "; ".join(report))


class _Reader(CalibrationDataReader):
    def __init__(self, x):
        self.data = iter([{"x": sample[None]} for sample in x])

    def get_next(self):
        return next(self.data, None)


def test_quantized_token_layers_match_the_reference(tmp_path):
    """onnxruntime's per-channel QDQ quantization of ``x -> MatMul -> Relu -> MatMul -> +x``
    on [1, T, D] (no biases: its Add of a bias becomes a [1, K]-only Gemm in the import of
    pre-quantized models), built with its own parameters (the weights' integers transposed
    with them): within 1 LSB of its reference path (onnxruntime, no graph optimization)."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["f"], name="fc2"),
             helper.make_node("Add", ["x", "f"], ["y"], name="residual")]
    path, quantized = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(make_model(nodes, {"x": [1, T, D]}, {"y": [1, T, D]},
                         {"w1": _w(rng, D, 2 * D), "w2": _w(rng, 2 * D, D)}), path)
    quantize_static(str(path), str(quantized), _Reader(_samples(7, 32, (1, T, D))),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    model = onnx.load(quantized)
    result = api.build(model, None, calib=None, verilog=False, log=quiet)
    assert "2 weight(s)" in next(n for n in result.graph.meta["notes"]
                                 if n.startswith("Quantization parameters imported"))
    x = _samples(8, 16, (1, T, D))
    golden = api.simulate(result, {"x": x}, mode="golden").outputs["y"]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    lsb = np.abs(golden - reference_outputs(model, {"x": x})[0]) / float(inits[last.input[1]])
    print(f"\nQDQ tokens vs its reference: {np.count_nonzero(lsb > 0.5)} of {lsb.size} differ, "
          f"largest {lsb.max():.2f} LSB")
    assert lsb.max() <= 1 + 1e-3


@pytest.mark.rtl
def test_prenorm_block_on_rtl(tmp_path):
    """The pre-norm block on the 8x8 RTL (the host's LayerNorm and views, then the
    accelerator): every layer equal to golden bit for bit, every sample in the predicted
    cycles."""
    result = api.build(prenorm(), tmp_path / "build", calib={"x": _samples(4, 64, (1, T, D))},
                       log=quiet)
    rtl = rtl_matches_golden(result, {"x": _samples(9, 3, (1, T, D))}, 3)
    print(f"\nRTL: {rtl.cycles[0]} cycles per sample of {T} tokens (predicted "
          f"{rtl.predicted_cycles})")


def along_tokens(form: str) -> onnx.ModelProto:
    """Nodes along the token axis (the image's height) between token MatMuls: ``slice``
    (tokens 1 to 3, axes given as -2), ``gather`` (the list [2]: a [1, 1, D] token), ``concat``
    (a computed token joined after the tokens), ``host`` (a Slice of a LayerNorm's result,
    which the host runs, then a MatMul)."""
    rng = np.random.default_rng(10)
    inits = {"w": _w(rng, D, D), "w2": _w(rng, D, D), "g": rng.uniform(0.5, 1.5, D).astype(F32),
             "beta": _w(rng, D, s=0.1)}
    first = helper.make_node("MatMul", ["x", "w"], ["a"], name="fc1")
    last = helper.make_node("MatMul", ["p", "w2"], ["y"], name="fc2")
    if form == "slice":
        inits.update(starts=np.array([1], np.int64), ends=np.array([4], np.int64),
                     axes=np.array([-2], np.int64))
        pick, shape = helper.make_node("Slice", ["a", "starts", "ends", "axes"], ["p"],
                                       name="pick"), [1, 3, D]
    elif form == "gather":
        inits["index"] = np.array([2], np.int64)
        pick, shape = helper.make_node("Gather", ["a", "index"], ["p"], name="pick",
                                       axis=-2), [1, 1, D]
    elif form == "concat":
        inits["index"] = np.array([0], np.int64)
        return make_model([first, helper.make_node("Gather", ["a", "index"], ["t"], name="tok",
                                                   axis=1),
                           helper.make_node("Relu", ["t"], ["r"], name="relu"),
                           helper.make_node("Concat", ["a", "r"], ["p"], name="pick", axis=1),
                           last], {"x": [1, T, D]}, {"y": [1, T + 1, D]}, inits)
    else:
        inits.update(starts=np.array([0, 0], np.int64), ends=np.array([1, 1], np.int64),
                     axes=np.array([0, 1], np.int64))
        ln = helper.make_node("LayerNormalization", ["a", "g", "beta"], ["n"], name="norm")
        pick, shape = helper.make_node("Slice", ["n", "starts", "ends", "axes"], ["p"],
                                       name="pick"), [1, 1, D]
        return make_model([first, ln, pick, last], {"x": [1, T, D]}, {"y": shape}, inits)
    return make_model([first, pick, last], {"x": [1, T, D]}, {"y": shape}, inits)


@pytest.mark.parametrize("form", ["slice", "gather", "concat", "host"])
def test_nodes_along_the_tokens_are_the_images_rows(form):
    """A Slice, a Gather or a Concat along the tokens is one along the height of the image
    [1, D, T, 1]: on the array, or on the host where it reads the host's LayerNorm (a host
    Gather of those rows); the float graph computes the model. Built, the Slice and Gather are
    copies of the image's rows (QSlice, bit for bit in the golden model), the Concat a QConcat
    along the height."""
    model = along_tokens(form)
    graph = load_model(model)
    x = _samples(11, 8, (1, T, D))
    got = evaluate_float(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, _onnxruntime(model, x)[0], rtol=1e-5, atol=1e-5)
    pick = next(n for n in graph.nodes if n.name == "pick")
    steps = graph.meta.get("host_steps", {})
    if form == "host":
        assert (pick.op, dict(pick.attrs)) == ("Gather", {"axis": 2, "indices": (0,)})
        assert steps["pick"]["why"] == (
            "Slice cuts the tokens 0 to 0, rows of the image [1, 12, 6, 1] (it reads the host "
            "value 'n_image'); between accelerator segments: the host reads its input back "
            "and writes its result, quantized, into the next segment")
    else:
        assert pick.op == ("Concat" if form == "concat" else "Slice")
        assert "pick" not in steps and pick.attrs.get("axis", 2) == 2
        assert graph.types[pick.inputs[0]].shape == (1, D, T, 1)
    result = api.build(model, None, calib={"x": _samples(12, 32, (1, T, D))}, verilog=False,
                       log=quiet)
    node = next(n for n in result.graph.nodes if n.name == "pick")
    assert node.op == {"slice": "QSlice", "gather": "QSlice", "concat": "QConcat",
                       "host": "Gather"}[form]
    if node.op == "QSlice":
        env = evaluate(result.graph, {"x": x}, keep_all=True)
        first = 1 if form == "slice" else 2
        rows = result.graph.types[node.outputs[0]].shape[2]
        np.testing.assert_array_equal(env[node.outputs[0]],
                                      env[node.inputs[0]][:, :, first:first + rows])
