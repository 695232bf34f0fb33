"""Host steps (issue #3): operators without a hardware mapping at the start of the graph (a
float pre-processing chain on the input) or at its end (Softmax, LogSoftmax, ArgMax, TopK, a
reordering Transpose) run on the host in float32 NumPy; anywhere else they are refused in one
error. Each host operator is compared with onnxruntime on the very values it reads: the prefix
on the model's input, the suffix on the dequantized accelerator output."""

import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from helpers import quiet, raises
from spec_helpers import SUPPORTED, ort_outputs

from hwonnx import api
from hwonnx.cli import main
from hwonnx.errors import ModelError, QuantizationError, UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate
from hwonnx.report import placement

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
START = "at the start of the graph, before the accelerator's input"
END = "at the end of the graph, after the accelerator's output"


def make(nodes, inputs, outputs, inits=None, opset=17):
    """A model; ``inputs``: name -> shape, ``outputs``: name -> (elem type, shape)."""
    graph = helper.make_graph(
        nodes, "host",
        [helper.make_tensor_value_info(n, FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, e, s) for n, (e, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32),
            "fc": rng.normal(0, 0.3, (5, 64)).astype(np.float32),
            "mean": np.array([0.4, 0.5, 0.6], np.float32).reshape(1, 3, 1, 1),
            "std": np.array([0.2, 0.25, 0.3], np.float32).reshape(1, 3, 1, 1)}


def conv_core(source):
    """Conv 3->4 (3x3, pad 1) + Relu + Flatten + Gemm 64->5 on a [1, 3, 4, 4] ``source``."""
    return [helper.make_node("Conv", [source, "w"], ["conv_out"], name="conv",
                             pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
            helper.make_node("Flatten", ["relu_out"], ["flat_out"], name="flat"),
            helper.make_node("Gemm", ["flat_out", "fc"], ["logits"], name="fc", transB=1)]


def compile_(model, shape, seed=1, samples=32):
    rng = np.random.default_rng(seed)
    calib = rng.uniform(0, 1, (samples,) + tuple(shape)).astype(np.float32)
    return api.build(model, None, calib={"x": calib}, log=quiet)


def where(result) -> "dict[str, tuple[str, str]]":
    return {row["node"]: (row["where"], row["why"]) for row in placement(result.graph)}


def with_output(model, value, shape):
    """``model`` with the intermediate ``value`` (float, ``shape``) as an extra output."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.append(helper.make_tensor_value_info(value, FLOAT, shape))
    return copy


def check_prefix(model, result, value, shape, x):
    """The host prefix's float result ``value`` (the accelerator's input before quantization)
    against onnxruntime on the same float input ``x`` ([S, 1, ...]); returns the largest
    difference. Single IEEE float32 operations per element: equal bit for bit."""
    env = evaluate(result.graph, {"x": x.reshape((-1,) + x.shape[2:])}, keep_all=True)
    got = env[value]
    reference = with_output(model, value, shape)
    expected = np.concatenate([dict(zip(*ort_outputs(reference, {"x": sample})))[value]
                               for sample in x])
    assert got.dtype == np.float32
    diff = float(np.abs(got - expected).max())
    print(f"\nhost prefix '{value}' vs onnxruntime: max |difference| {diff:g}")
    np.testing.assert_array_equal(got, expected)
    # ... and the accelerator's input is exactly its quantization
    q = result.graph.producer(result.program.input_value)
    assert q.inputs == (value,)
    return diff


def suffix_model(nodes, source, source_shape, outputs, inits=None):
    return make(nodes, {source: source_shape}, outputs, inits)


def check_suffix(result, x, nodes, source, source_shape, outputs, inits=None, rtol=0.0,
                 atol=0.0):
    """The host suffix's outputs (``api.simulate`` golden mode) against onnxruntime running
    the suffix ``nodes`` on the dequantized accelerator output ``source``: indices exactly,
    values within ``rtol``/``atol`` (0: exactly), same dtype."""
    env = evaluate(result.graph, {"x": x.reshape((-1,) + x.shape[2:])}, keep_all=True)
    sim = api.simulate(result, {"x": x}, mode="golden")
    model = suffix_model(nodes, source, source_shape, outputs, inits)
    largest = {}
    for index, sample in enumerate(env[source]):
        names, expected = ort_outputs(model, {source: sample[None]})
        for name, want in zip(names, expected):
            got = sim.outputs[name][index:index + 1]
            assert got.dtype == want.dtype, name
            assert got.shape == want.shape, name
            if want.dtype == np.int64:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
                largest[name] = max(largest.get(name, 0.0), float(np.abs(got - want).max()))
    print("\nhost suffix vs onnxruntime: max |difference| " +
          (", ".join(f"{k} {v:g}" for k, v in largest.items()) or "none (indices only)"))
    return sim


# (a) each host operator against onnxruntime ----------------------------------------------------

def test_mean_std_normalization_runs_on_the_host():
    nodes = [helper.make_node("Sub", ["x", "mean"], ["s"], name="sub_mean"),
             helper.make_node("Div", ["s", "std"], ["n"], name="div_std")] + conv_core("n")
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"logits": (FLOAT, [1, 5])}, weights())
    result = compile_(model, (1, 3, 4, 4))
    places = where(result)
    assert places["sub_mean"] == ("host", f"Sub has no hardware mapping; {START}")
    assert places["div_std"] == ("host", f"Div has no hardware mapping; {START}")
    assert places["conv"] == ("hardware", "convolution on the systolic array")
    x = np.random.default_rng(2).uniform(0, 1, (6, 1, 3, 4, 4)).astype(np.float32)
    check_prefix(model, result, "n", [1, 3, 4, 4], x)


def test_nhwc_transpose_runs_on_the_host():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="nhwc", perm=[0, 3, 1, 2])] + \
        conv_core("t")
    model = make(nodes, {"x": [1, 4, 4, 3]}, {"logits": (FLOAT, [1, 5])}, weights())
    result = compile_(model, (1, 4, 4, 3))
    assert where(result)["nhwc"] == ("host", ("Transpose has no hardware mapping (perm [0, 3, 1, "
                                             f"2] reorders axes of size > 1 of [1, 4, 4, 3]); "
                                             f"{START}"))
    x = np.random.default_rng(3).uniform(0, 1, (4, 1, 4, 4, 3)).astype(np.float32)
    check_prefix(model, result, "t", [1, 3, 4, 4], x)


def test_cast_and_reshape_before_a_normalization_run_on_the_host():
    nodes = [helper.make_node("Cast", ["x"], ["f32"], name="cast", to=FLOAT),
             helper.make_node("Reshape", ["f32", "shape"], ["img"], name="to_image"),
             helper.make_node("Sub", ["img", "mean"], ["n"], name="sub_mean")] + conv_core("n")
    model = make(nodes, {"x": [1, 48]}, {"logits": (FLOAT, [1, 5])},
                 {**weights(), "shape": np.array([1, 3, 4, 4], np.int64)})
    result = compile_(model, (1, 48))
    places = where(result)
    assert places["cast"] == ("host", f"Cast has no hardware mapping; {START}")
    assert places["to_image"] == ("host", ("Reshape could map to the array, but Sub 'sub_mean' "
                                          f"after it cannot; {START}"))
    x = np.random.default_rng(4).uniform(0, 1, (5, 1, 48)).astype(np.float32)
    check_prefix(model, result, "n", [1, 3, 4, 4], x)


def test_flatten_before_a_host_step_runs_on_the_host():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flat"),
             helper.make_node("Sub", ["f", "m"], ["n"], name="center"),
             helper.make_node("Gemm", ["n", "fc"], ["logits"], name="fc", transB=1)]
    model = make(nodes, {"x": [1, 4, 4, 4]}, {"logits": (FLOAT, [1, 5])},
                 {"m": np.float32(0.5), "fc": weights()["fc"]})
    result = compile_(model, (1, 4, 4, 4))
    assert where(result)["flat"] == ("host", ("Flatten could map to the array, but Sub 'center' "
                                             f"after it cannot; {START}"))
    x = np.random.default_rng(20).uniform(0, 1, (3, 1, 4, 4, 4)).astype(np.float32)
    check_prefix(model, result, "n", [1, 64], x)


def test_uint8_image_cast_to_float_on_the_host():
    nodes = [helper.make_node("Cast", ["x"], ["f"], name="cast", to=FLOAT),
             helper.make_node("Transpose", ["f"], ["t"], name="nhwc", perm=[0, 3, 1, 2]),
             helper.make_node("Div", ["t", "k"], ["n"], name="scale")] + conv_core("n")
    graph = helper.make_graph(
        nodes, "u8", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 4, 3])],
        [helper.make_tensor_value_info("logits", FLOAT, [1, 5])],
        [numpy_helper.from_array(np.asarray(v), k)
         for k, v in {"w": weights()["w"], "fc": weights()["fc"], "k": np.float32(255)}.items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(21)
    calib = rng.integers(0, 256, (16, 1, 4, 4, 3)).astype(np.uint8)
    result = api.build(model, None, calib={"x": calib}, log=quiet)
    assert result.graph.types["x"].dtype == "uint8"
    assert where(result)["cast"] == ("host", f"Cast has no hardware mapping; {START}")
    x = rng.integers(0, 256, (4, 1, 4, 4, 3)).astype(np.uint8)
    env = evaluate(result.graph, {"x": x.reshape(4, 4, 4, 3)}, keep_all=True)
    session = onnxruntime.InferenceSession(
        with_output(model, "n", [1, 3, 4, 4]).SerializeToString(),
        providers=["CPUExecutionProvider"])
    expected = np.concatenate([session.run(["n"], {"x": sample})[0] for sample in x])
    np.testing.assert_array_equal(env["n"], expected)       # float32 ops: bit for bit
    with raises(QuantizationError, "Input data: array 'x' holds 0.5, which is not a uint8 "
                "value (input 'x' is uint8)"):
        api.simulate(result, {"x": np.full(x.shape, 0.5, np.float32)}, mode="golden")


def test_integer_input_needs_a_cast():
    model = make([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [1, 4]},
                 {"y": (FLOAT, [1, 4])})
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.UINT8
    with raises(ModelError, "Graph input 'x' must be float32, float16, bfloat16 or float64, not "
                "uint8, unless only a Cast to float reads it (a host step)"):
        load_model(model)


def test_layout_after_the_last_host_step_stays_on_the_array():
    nodes = [helper.make_node("Div", ["x", "k"], ["n"], name="scale"),
             helper.make_node("Flatten", ["n"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc", transB=1)]
    model = make(nodes, {"x": [1, 4, 4, 4]}, {"logits": (FLOAT, [1, 5])},
                 {"k": np.float32(255), "fc": weights()["fc"]})
    result = compile_(model, (1, 4, 4, 4))
    places = where(result)
    assert places["scale"][0] == "host" and places["flat"][0] == "hardware"
    x = np.random.default_rng(5).uniform(0, 255, (3, 1, 4, 4, 4)).astype(np.float32)
    check_prefix(model, result, "n", [1, 4, 4, 4], x)


@pytest.mark.parametrize("op", ["Sub", "Div"])
def test_constant_first_operand(op):
    nodes = [helper.make_node(op, ["c", "x"], ["n"], name="pre")] + conv_core("n")
    c = np.random.default_rng(6).uniform(1, 2, (1, 3, 1, 1)).astype(np.float32)
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"logits": (FLOAT, [1, 5])}, {**weights(), "c": c})
    result = compile_(model, (1, 3, 4, 4))
    assert where(result)["pre"][0] == "host"
    x = np.random.default_rng(7).uniform(0.5, 1.5, (4, 1, 3, 4, 4)).astype(np.float32)
    check_prefix(model, result, "n", [1, 3, 4, 4], x)


@pytest.mark.parametrize("op, shape, detail", [
    ("Add", (1, 3, 1, 1), (" (only a per-channel constant after a Conv, Gemm or per-channel Mul "
                          "is folded into its bias)")),
    ("Mul", (1, 3, 4, 4), (" (a constant of shape [1, 3, 4, 4] is neither a scalar nor per "
                          "channel)")),
])
def test_add_and_mul_without_an_array_form_run_on_the_host(op, shape, detail):
    nodes = [helper.make_node(op, ["x", "c"], ["n"], name="pre")] + conv_core("n")
    c = np.random.default_rng(8).uniform(-1, 1, shape).astype(np.float32)
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"logits": (FLOAT, [1, 5])}, {**weights(), "c": c})
    result = compile_(model, (1, 3, 4, 4))
    assert where(result)["pre"] == ("host", f"{op} has no hardware mapping{detail}; {START}")
    x = np.random.default_rng(9).uniform(0, 1, (4, 1, 3, 4, 4)).astype(np.float32)
    check_prefix(model, result, "n", [1, 3, 4, 4], x)


def test_per_channel_scale_and_bias_keep_running_on_the_array():
    # Mul and Add by per-channel constants map (a depthwise 1x1 Conv with a bias): no host
    # step, exactly as before host steps existed.
    rng = np.random.default_rng(10)
    inits = {**weights(), "s": rng.uniform(0.5, 2, (1, 3, 1, 1)).astype(np.float32),
             "b": rng.uniform(-1, 1, (1, 3, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"], name="scale"),
             helper.make_node("Add", ["m", "b"], ["n"], name="shift")] + conv_core("n")
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"logits": (FLOAT, [1, 5])}, inits)
    result = compile_(model, (1, 3, 4, 4))
    assert "host_steps" not in result.graph.meta
    assert where(result)["scale"] == ("hardware", "convolution on the systolic array")
    assert result.graph.nodes[0].op == "Quantize" and result.graph.nodes[0].inputs == ("x",)


def test_array_form_before_a_host_step_moves_to_the_host():
    rng = np.random.default_rng(11)
    inits = {**weights(), "s": rng.uniform(0.5, 2, (1, 3, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"], name="scale"),
             helper.make_node("Sub", ["m", "mean"], ["n"], name="sub_mean")] + conv_core("n")
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"logits": (FLOAT, [1, 5])}, inits)
    result = compile_(model, (1, 3, 4, 4))
    assert where(result)["scale"] == ("host", ("Mul could map to the array, but Sub 'sub_mean' "
                                              f"after it cannot; {START}"))
    x = rng.uniform(0, 1, (4, 1, 3, 4, 4)).astype(np.float32)
    check_prefix(model, result, "n", [1, 3, 4, 4], x)


SUFFIXES = {
    "softmax": ([helper.make_node("Softmax", ["logits"], ["y"], name="probs", axis=1)],
                {"y": (FLOAT, [1, 5])}),
    "softmax_unsqueezed": ([helper.make_node("Softmax", ["logits"], ["p"], name="probs"),
                            helper.make_node("Unsqueeze", ["p", "axes"], ["y"], name="unsq")],
                           {"y": (FLOAT, [1, 5, 1])}),
    "log_softmax": ([helper.make_node("LogSoftmax", ["logits"], ["y"], name="log_probs")],
                    {"y": (FLOAT, [1, 5])}),
    "argmax": ([helper.make_node("ArgMax", ["logits"], ["y"], name="cls", axis=1)],
               {"y": (INT64, [1, 1])}),
    "argmax_flat_last": ([helper.make_node("ArgMax", ["logits"], ["y"], name="cls", axis=-1,
                                           keepdims=0, select_last_index=1)],
                         {"y": (INT64, [1])}),
    "argmax_default_axis_0": ([helper.make_node("ArgMax", ["logits"], ["y"], name="cls")],
                              {"y": (INT64, [1, 5])}),               # per sample: all 0
    "topk": ([helper.make_node("TopK", ["logits", "k"], ["v", "i"], name="top")],
             {"v": (FLOAT, [1, 3]), "i": (INT64, [1, 3])}),
    "topk_indices_only": ([helper.make_node("TopK", ["logits", "k"], ["v", "i"], name="top")],
                          {"i": (INT64, [1, 3])}),
    "topk_smallest": ([helper.make_node("TopK", ["logits", "k"], ["v", "i"], name="top",
                                        axis=1, largest=0)],
                      {"v": (FLOAT, [1, 3]), "i": (INT64, [1, 3])}),
    "softmax_argmax_topk": ([helper.make_node("Softmax", ["logits"], ["p"], name="probs"),
                             helper.make_node("ArgMax", ["logits"], ["c"], name="cls", axis=1),
                             helper.make_node("TopK", ["p", "k"], ["v", "i"], name="top")],
                            {"p": (FLOAT, [1, 5]), "c": (INT64, [1, 1]),
                             "v": (FLOAT, [1, 3]), "i": (INT64, [1, 3])}),
}


@pytest.mark.parametrize("case", sorted(SUFFIXES))
def test_end_of_graph_runs_on_the_host(case):
    suffix, outputs = SUFFIXES[case]
    extra = {"k": np.array([3], np.int64), "axes": np.array([2], np.int64)}
    model = make(conv_core("x") + suffix, {"x": [1, 3, 4, 4]}, outputs, {**weights(), **extra})
    result = compile_(model, (1, 3, 4, 4))
    places = where(result)
    for node in suffix:
        assert places[node.name][0] == "host"
        assert places[node.name][1].endswith(END)
    assert places[suffix[0].name][1] == f"{suffix[0].op_type} has no hardware mapping; {END}"
    assert result.program.output_value == "logits:q"
    x = np.random.default_rng(12).uniform(0, 1, (8, 1, 3, 4, 4)).astype(np.float32)
    # exp and log differ between NumPy and onnxruntime in the last bits
    sim = check_suffix(result, x, suffix, "logits", [1, 5], outputs, extra, rtol=1e-5,
                       atol=1e-6)
    for name, (elem, _) in outputs.items():
        assert sim.outputs[name].dtype == (np.int64 if elem == INT64 else np.float32)


def test_ties_in_the_dequantized_output_pick_the_first_index_like_onnxruntime():
    # Dequantized int8 values repeat; ArgMax/TopK must break ties as onnxruntime does.
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("ArgMax", ["logits"], ["c"], name="cls", axis=1),
             helper.make_node("TopK", ["logits", "k"], ["v", "i"], name="top")]
    w = np.repeat(np.eye(4, dtype=np.float32), 3, axis=1)           # 12 logits, 3 of each
    outputs = {"c": (INT64, [1, 1]), "v": (FLOAT, [1, 5]), "i": (INT64, [1, 5])}
    model = make(nodes, {"x": [1, 4]}, outputs, {"w": w, "k": np.array([5], np.int64)})
    result = compile_(model, (1, 4))
    x = np.random.default_rng(13).uniform(0, 1, (6, 1, 4)).astype(np.float32)
    sim = check_suffix(result, x, nodes[1:], "logits", [1, 12], outputs,
                       {"k": np.array([5], np.int64)})
    assert (sim.outputs["i"][:, 0] % 3 == 0).all()        # the first of each equal triple


def test_reordering_transpose_at_the_end_runs_on_the_host():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["y"], name="nhwc", perm=[0, 2, 3, 1])]
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"y": (FLOAT, [1, 4, 4, 4])},
                 {"w": weights()["w"]})
    result = compile_(model, (1, 3, 4, 4))
    assert where(result)["nhwc"][0] == "host"
    x = np.random.default_rng(14).uniform(0, 1, (3, 1, 3, 4, 4)).astype(np.float32)
    check_suffix(result, x, nodes[1:], "c", [1, 4, 4, 4], {"y": (FLOAT, [1, 4, 4, 4])})


def test_host_steps_survive_the_build_folder(tmp_path):
    nodes = [helper.make_node("Sub", ["x", "mean"], ["n"], name="sub_mean")] + \
        conv_core("n") + [helper.make_node("ArgMax", ["logits"], ["y"], name="cls", axis=1)]
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"y": (INT64, [1, 1])}, weights())
    rng = np.random.default_rng(15)
    calib = rng.uniform(0, 1, (16, 1, 3, 4, 4)).astype(np.float32)
    built = api.build(model, tmp_path / "out", calib={"x": calib}, verilog=False, log=quiet)
    x = {"x": rng.uniform(0, 1, (5, 1, 3, 4, 4)).astype(np.float32)}
    again = api.simulate(tmp_path / "out", x, mode="golden")
    direct = api.simulate(built, x, mode="golden")
    np.testing.assert_array_equal(again.outputs["y"], direct.outputs["y"])
    assert again.outputs["y"].dtype == np.int64
    session_outputs = [ort_outputs(model, {"x": s})[1][0] for s in x["x"]]
    agree = np.mean([int(a.reshape(-1)[0]) == int(b.reshape(-1)[0])
                     for a, b in zip(again.outputs["y"], session_outputs)])
    print(f"\nint8 ArgMax agrees with the float model on {agree:.0%} of the samples")


# (b) a node with no hardware mapping in the middle ---------------------------------------------

def test_every_node_that_runs_on_neither_side_is_listed_in_one_error():
    rng = np.random.default_rng(16)
    inits = {f"w{i}": rng.normal(0, 1, (4, 4)).astype(np.float32) for i in range(4)}
    inits["c"] = np.float32(1)
    nodes = [helper.make_node("Gemm", ["x", "w0"], ["a"], name="fc0"),
             helper.make_node("Sub", ["a", "c"], ["b"], name="shift"),
             helper.make_node("Gemm", ["b", "w1"], ["d"], name="fc1"),
             helper.make_node("Softmax", ["d"], ["e"], name="probs"),
             helper.make_node("Gemm", ["e", "w2"], ["f"], name="fc2"),
             helper.make_node("ArgMax", ["f"], ["i"], name="pick", axis=1),
             helper.make_node("Cast", ["i"], ["k"], name="float", to=FLOAT),
             helper.make_node("Gemm", ["k", "w4"], ["m"], name="fc4"),
             helper.make_node("Sin", ["m"], ["g"], name="gate"),
             helper.make_node("Gemm", ["g", "w3"], ["h"], name="fc3"),
             helper.make_node("Hardmax", ["h"], ["hh"], name="hard"),
             helper.make_node("ArgMax", ["hh"], ["y"], name="cls", axis=1)]
    inits["w4"] = rng.normal(0, 1, (1, 4)).astype(np.float32)
    model = make(nodes, {"x": [1, 4]}, {"y": (INT64, [1, 1])}, inits)
    # The Sub, the Softmax and the ArgMax whose indices a Cast to float feeds on run on the
    # host between accelerator segments (before, they ran on neither side); the Sin and the
    # Hardmax run nowhere.
    with raises(UnsupportedOperatorError,
                "2 unsupported node(s): node 'gate' Sin (domain 'ai.onnx', opset 17); node "
                f"'hard' Hardmax (domain 'ai.onnx', opset 17); {SUPPORTED}") as info:
        load_model(model)
    assert [n[:2] for n in info.value.nodes] == [("gate", "Sin"), ("hard", "Hardmax")]


def test_a_host_step_needs_the_input_to_itself():
    # The graph input is read twice: the Div is no leading chain, but a host step before the
    # accelerator all the same (before, it ran on neither side); one segment reads x and the
    # Div's result, so the build is an ordinary one.
    nodes = [helper.make_node("Div", ["x", "k"], ["n"], name="scale"),
             helper.make_node("Add", ["n", "x"], ["s"], name="sum"),
             helper.make_node("Gemm", ["s", "w"], ["y"], name="fc")]
    model = make(nodes, {"x": [1, 4]}, {"y": (FLOAT, [1, 4])},
                 {"k": np.float32(2), "w": np.eye(4, dtype=np.float32)})
    graph = load_model(model)
    assert graph.meta["host_steps"]["scale"]["at"] == "middle"
    result = compile_(model, (1, 4))
    assert not result.segments
    assert where(result)["scale"] == ("host", "Div has no hardware mapping; before the "
                                      "accelerator's input (one accelerator segment: no round "
                                      "trip)")
    assert sorted(p.name for p in result.program.inputs) == ["n", "x"]


def test_constant_add_in_the_middle_runs_on_the_host():
    # An Add of a constant after an AveragePool has no array form (no bias to fold it into):
    # the host adds it after the accelerator's output (before, it ran on neither side), in
    # float32 on the dequantized pool: exactly p + 1.
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
             helper.make_node("Add", ["p", "b"], ["y"], name="offset")]
    model = make(nodes, {"x": [1, 3, 4, 4]}, {"y": (FLOAT, [1, 4, 1, 1])},
                 {"w": weights()["w"], "b": np.ones((1, 4, 1, 1), np.float32)})
    result = compile_(model, (1, 3, 4, 4))
    assert not result.segments
    assert where(result)["offset"] == ("host", (
        "Add of a constant that no bias of a Conv or Gemm right before it absorbs has no "
        "hardware mapping; after the accelerator's output (one accelerator segment: no round "
        "trip)"))
    x = {"x": np.random.default_rng(3).uniform(0, 1, (4, 3, 4, 4)).astype(np.float32)}
    golden = api.simulate(result, x, mode="golden")
    [dq] = [n for n in result.graph.nodes if n.op == "Dequantize"]
    pool = (golden.int_outputs.astype(np.float32) - dq.attrs["zero_point"]) \
        * np.float32(dq.attrs["scale"])
    np.testing.assert_array_equal(golden.outputs["y"], pool + np.float32(1))


# (c) where each node runs, and why: inspect and the build report -------------------------------

def full_model():
    """Transpose + Sub + Div on the host, Conv/Relu/Flatten/Gemm on the array, Softmax and
    ArgMax on the host."""
    rng = np.random.default_rng(17)
    inits = {"w": rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32),
             "fc": rng.normal(0, 0.2, (5, 8 * 6 * 6)).astype(np.float32),
             "mean": np.array([0.45, 0.5, 0.55], np.float32).reshape(1, 3, 1, 1),
             "std": np.array([0.22, 0.25, 0.28], np.float32).reshape(1, 3, 1, 1)}
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="nhwc", perm=[0, 3, 1, 2]),
             helper.make_node("Sub", ["t", "mean"], ["s"], name="sub_mean"),
             helper.make_node("Div", ["s", "std"], ["n"], name="div_std"),
             helper.make_node("Conv", ["n", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc", transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
             helper.make_node("ArgMax", ["logits"], ["cls"], name="argmax", axis=1)]
    return make(nodes, {"x": [1, 6, 6, 3]},
                {"probs": (FLOAT, [1, 5]), "cls": (INT64, [1, 1])}, inits)


PLACEMENT = [
    ("nhwc", "Transpose", "host", ("Transpose has no hardware mapping (perm [0, 3, 1, 2] "
                                  f"reorders axes of size > 1 of [1, 6, 6, 3]); {START}")),
    ("sub_mean", "Sub", "host", f"Sub has no hardware mapping; {START}"),
    ("div_std", "Div", "host", f"Div has no hardware mapping; {START}"),
    ("quantize_n", "Quantize", "host", "converts the float input to int8 before it is sent"),
    ("conv", "QConv", "hardware", "convolution on the systolic array"),
    ("flat", "Flatten", "hardware", "layout only: the buffer is read in another order"),
    ("fc", "QDense", "hardware", "matrix multiply on the systolic array"),
    ("dequantize_logits", "Dequantize", "host", "converts the int8 result back to float"),
    ("softmax", "Softmax", "host", f"Softmax has no hardware mapping; {END}"),
    ("argmax", "ArgMax", "host", f"ArgMax has no hardware mapping; {END}"),
]


def test_inspect_shows_where_each_node_runs_and_why(tmp_path, capsys):
    onnx.save(full_model(), tmp_path / "m.onnx")
    assert main(["inspect", str(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    got = [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows]
    assert [(r[0], r[1], r[2], r[5]) for r in got] == PLACEMENT
    assert all(r[3] and r[4] for r in got if r[2] == "hardware" and r[1] != "Flatten")


def test_build_report_shows_where_each_node_runs_and_why(tmp_path):
    rng = np.random.default_rng(18)
    calib = rng.uniform(0, 1, (16, 1, 6, 6, 3)).astype(np.float32)
    api.build(full_model(), tmp_path / "out", calib={"x": calib}, verilog=False, log=quiet)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(r["node"], r["op"], r["where"], r["why"]) for r in report["placement"]] == \
        PLACEMENT
    text = (tmp_path / "out" / "report.md").read_text()
    for node, op, side, why in PLACEMENT:
        assert f"| {node} | {op} | {side} | {why} |" in text


# (d) the RTL runs the accelerator part; the host steps around it --------------------------------

@pytest.mark.rtl
def test_host_prefix_and_suffix_around_the_rtl(tmp_path, capsys):
    rng = np.random.default_rng(19)
    model = full_model()
    calib = rng.uniform(0, 1, (64, 1, 6, 6, 3)).astype(np.float32)
    out = tmp_path / "out"
    result = api.build(model, out, calib={"x": calib}, log=quiet)      # default 8x8 array
    x = rng.uniform(0, 1, (12, 1, 6, 6, 3)).astype(np.float32)
    rtl = api.simulate(out, {"x": x}, mode="compare", log=quiet)        # MismatchError if not
    golden = api.simulate(result, {"x": x}, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * len(x)
    for name in ("probs", "cls"):
        assert rtl.outputs[name].dtype == golden.outputs[name].dtype
        np.testing.assert_array_equal(rtl.outputs[name], golden.outputs[name])
    assert rtl.outputs["cls"].dtype == np.int64
    np.testing.assert_array_equal(rtl.outputs["cls"][:, 0],
                                  rtl.outputs["probs"].argmax(axis=1))

    # the same through ``hwonnx sim``
    np.save(tmp_path / "x.npy", x)
    assert main(["sim", str(out), "--input", str(tmp_path / "x.npy"), "--compare",
                 "--output", str(tmp_path / "y.npz")]) == 0
    assert "RTL equals the golden model bit for bit" in capsys.readouterr().out
    with np.load(tmp_path / "y.npz") as saved:
        for name in ("probs", "cls"):
            assert saved[name].dtype == golden.outputs[name].dtype
            np.testing.assert_array_equal(saved[name], golden.outputs[name])

    # against the float model: int8 quantization error only, reported
    reference = [ort_outputs(model, {"x": s})[1] for s in x]
    probs = np.concatenate([r[0] for r in reference])
    classes = np.concatenate([r[1] for r in reference])
    error = float(np.abs(rtl.outputs["probs"] - probs).max())
    agreement = float((rtl.outputs["cls"] == classes).mean())
    print(f"\nRTL + host vs onnxruntime float: max |probability difference| {error:.4f}, "
          f"ArgMax agreement {agreement:.0%}")
    assert classes.dtype == np.int64
    assert agreement >= 0.75
