"""The batch axis (issue 13, "Batch"): a model with a fixed batch N (PyTorch exports write
N = 789444), a symbolic batch or a batch of 1 compiles to the same batch-1 program, with a
warning when N > 1; ``--input-shape`` rebinds a fixed batch to 1; ``sim`` streams the samples
through the program. A graph that does not keep its samples apart (a batch folded into the
features, a Transpose moving axis 0, a Softmax across the batch) is refused by name.

The references: the same model with its batch set to 1 by hand (bit for bit); onnxruntime's
reference path (no graph optimization, ``ort_reference``) on that model quantized by
onnxruntime (QDQ), one sample at a time (hwonnx builds the fixed-batch QDQ model); and, for
the float graph, onnxruntime on the fixed-batch model itself, all N samples in one run."""

import json
import re

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from hwonnx import api
from hwonnx.cli import main
from hwonnx.errors import ModelError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_outputs
from helpers import raises
from spec_helpers import make_model, ort_outputs, rand

N = 789444                         # what PyTorch's exporter writes for a traced batch
WHY = ("hwonnx compiles a batch-1 program and streams the samples through it one at a time, "
       "so the batch must stay the leading axis of every value and no node may work across it")


def _warning(name, n, shape, single):
    return (f"Input '{name}' has a batch of {n} (shape {shape}); hwonnx compiles a batch-1 "
            f"program (input shape {single}) and 'sim' and 'run' stream the samples through "
            f"it one at a time")


def _mlp(batch=N):
    """Gemm 16 -> 32, Relu, Gemm 32 -> 10, as PyTorch exports an nn.Sequential of Linear
    layers: input [batch, 16], output [batch, 10]."""
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="Gemm_0", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="Relu_1"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="Gemm_2", transB=1)]
    inits = {"w1": rand(32, 16) * 0.3, "b1": rand(32, seed=1) * 0.1,
             "w2": rand(10, 32, seed=2) * 0.3, "b2": rand(10, seed=3) * 0.1}
    return make_model(nodes, {"x": [batch, 16]}, {"y": [batch, 10]}, inits)


def _conv_net(batch=64, target=None):
    """Conv 3 -> 4 (3x3, pad 1), Relu, MaxPool 2x2, Reshape to ``target`` (default
    ``[batch, -1]``: the batch spelled out), Gemm 64 -> 5."""
    target = [batch, -1] if target is None else target
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Reshape", ["p", "t"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"], name="fc", transB=1)]
    inits = {"w": rand(4, 3, 3, 3) * 0.3, "b": rand(4, seed=1) * 0.1,
             "t": np.array(target, np.int64), "g": rand(5, 64, seed=2) * 0.2,
             "gb": rand(5, seed=3) * 0.1}
    return make_model(nodes, {"x": [batch, 3, 8, 8]}, {"y": [batch, 5]}, inits)


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def mlp_build(tmp_path_factory):
    """The fixed-batch MLP built to a folder on the default 'sim' board (Verilog too)."""
    out = tmp_path_factory.mktemp("batch") / "mlp"
    calib = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    return api.build(_mlp(), out, calib={"x": calib}, log=_quiet), out


# the frontend -----------------------------------------------------------------------------------

def test_fixed_batch_binds_to_one_with_a_warning():
    graph = load_model(_mlp())
    assert graph.types["x"].shape == (1, 16) and graph.types["y"].shape == (1, 10)
    assert graph.meta["warnings"] == (_warning("x", N, "789444x16", "1x16"),)
    assert graph.meta["batches"] == {"x": N}
    assert graph.meta["inputs"][0]["declared"] == "789444x16"
    assert graph.meta["inputs"][0]["shape"] == [1, 16]


@pytest.mark.parametrize("target", [[64, -1], [-1, 64], [0, 64], [64, 64]])
def test_fixed_batch_conv_net_follows_onnxruntime_on_the_whole_batch(target):
    """The float graph, run sample by sample, equals onnxruntime running the fixed-batch model
    on its 64 samples at once; a Reshape target spelling the batch is rewritten to 1."""
    model = _conv_net(64, target)
    graph = load_model(model)
    assert graph.types["x"].shape == (1, 3, 8, 8) and graph.types["y"].shape == (1, 5)
    reshape = next(node for node in graph.nodes if node.op == "Reshape")
    assert reshape.attrs["shape"] == (1, 64)
    x = rand(64, 3, 8, 8, seed=5)
    _, (want,) = ort_outputs(model, {"x": x})
    got = np.concatenate([evaluate_float(graph, {"x": x[i:i + 1]})["y"] for i in range(64)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_pytorch_dynamic_flatten_and_squeeze_without_axes_follow_the_batch():
    """x.view(x.size(0), -1) as exported (Shape, Gather, Unsqueeze, Concat, Reshape) and a
    Squeeze without axes after a global pool: with batch 1 the Squeeze would drop the batch
    too, so it gets the axes it squeezes with the model's batch."""
    batch = 6
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="gap"),
             helper.make_node("Squeeze", ["p"], ["q"], name="squeeze"),
             helper.make_node("Shape", ["q"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"], name="unsqueeze"),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], name="cat", axis=0),
             helper.make_node("Reshape", ["q", "target"], ["f"], name="view"),
             helper.make_node("Gemm", ["f", "g"], ["y"], name="fc", transB=1)]
    inits = {"w": rand(4, 3, 3, 3), "zero": np.array(0, np.int64),
             "axis0": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
             "g": rand(5, 4, seed=2)}
    model = make_model(nodes, {"x": [batch, 3, 6, 6]}, {"y": [batch, 5]}, inits)
    graph = load_model(model)
    assert graph.types["y"].shape == (1, 5)
    x = rand(batch, 3, 6, 6, seed=7)
    _, (want,) = ort_outputs(model, {"x": x})
    got = np.concatenate([evaluate_float(graph, {"x": x[i:i + 1]})["y"] for i in range(batch)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_symbolic_batch_bound_above_one_compiles_to_batch_one():
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)],
                       {"x": ["batch", 16]}, {"y": ["batch", 3]}, {"w": rand(3, 16)})
    assert load_model(model).meta["warnings"] == ()                 # batch 1: nothing to say
    graph = load_model(model, input_shapes={"x": (8, 16)})
    assert graph.types["x"].shape == (1, 16)
    assert graph.meta["warnings"] == (_warning("x", 8, "8x16", "1x16"),)


def test_input_shape_rebinds_a_fixed_batch_to_one():
    graph = load_model(_mlp(), input_shapes={"x": (1, 16)})
    assert graph.types["x"].shape == (1, 16)
    assert graph.meta["warnings"] == (_warning("x", N, "789444x16", "1x16"),)
    with raises(ModelError, "Input shape 4x16 given for 'x' contradicts the model's 789444x16 "
                "at axis 0 (a fixed batch can be rebound only to 1: hwonnx compiles batch-1 "
                "programs)"):
        load_model(_mlp(), input_shapes={"x": (4, 16)})
    with raises(ModelError, "Input shape 1x17 given for 'x' contradicts the model's 789444x16 "
                "at axis 1"):
        load_model(_mlp(), input_shapes={"x": (1, 17)})


def test_input_size_limit_is_per_sample():
    """A fixed batch of 789444 images of 3x32x32 is 2.4e9 elements; each sample is 3072."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       {"x": [N, 3, 32, 32]}, {"y": [N, 3, 32, 32]})
    assert load_model(model).types["x"].shape == (1, 3, 32, 32)


def _fc(source, features):
    return helper.make_node("Gemm", [source, "g"], ["y"], name="fc", transB=1), \
        rand(5, features, seed=2)


@pytest.mark.parametrize("case", ["reshape", "flatten", "transpose", "unsqueeze", "softmax",
                                  "add"])
def test_a_graph_mixing_the_batch_is_refused_by_name(case):
    """Each of these models mixes its 4 samples: compiling it as batch 1 would be a silent
    wrong answer (before, the first two compiled as one sample of 4x16 values)."""
    batch = 4
    if case in ("reshape", "flatten"):
        fold = helper.make_node("Reshape", ["x", "t"], ["f"], name="fold") if case == "reshape" \
            else helper.make_node("Flatten", ["x"], ["f"], name="fold", axis=0)
        fc, g = _fc("f", 64)
        model = make_model([fold, fc], {"x": [batch, 16]}, {"y": [1, 5]},
                           {"t": np.array([1, -1], np.int64), "g": g})
        message = (f"{'Reshape' if case == 'reshape' else 'Flatten'} 'fold' folds the batch "
                   f"axis into the features (its output 'f' of shape [1, 64])")
    elif case == "transpose":
        fc, g = _fc("t", 4)
        model = make_model([helper.make_node("Transpose", ["x"], ["t"], name="swap",
                                             perm=[1, 0]), fc],
                           {"x": [batch, 16]}, {"y": [16, 5]}, {"g": g})
        message = "Transpose 'swap' has perm [1, 0], which moves the batch axis to axis 1"
    elif case == "unsqueeze":
        model = make_model([helper.make_node("Unsqueeze", ["x", "axes"], ["u"], name="lift"),
                            helper.make_node("Relu", ["u"], ["y"], name="relu")],
                           {"x": [batch, 3, 8, 8]}, {"y": [1, batch, 3, 8, 8]},
                           {"axes": np.array([0], np.int64)})
        message = ("Unsqueeze 'lift' inserts an axis before the batch axis (its output 'u' of "
                   "shape [1, 4, 3, 8, 8])")
    elif case == "softmax":
        fc, g = _fc("x", 16)
        fc.output[0] = "h"
        model = make_model([fc, helper.make_node("Softmax", ["h"], ["y"], name="norm", axis=0)],
                           {"x": [batch, 16]}, {"y": [batch, 5]}, {"g": g})
        message = "Softmax 'norm' works along axis 0, the batch axis"
    else:
        fc, g = _fc("x", 16)
        fc.output[0] = "h"
        model = make_model([fc, helper.make_node("Add", ["h", "per_sample"], ["y"], name="add")],
                           {"x": [batch, 16]}, {"y": [batch, 5]},
                           {"g": g, "per_sample": rand(batch, 5)})
        message = ("Add 'add' reads 'per_sample' of shape [4, 5], whose leading axis runs "
                   "along the batch")
    with raises(ModelError, f"{message}; axis 0 of input 'x' is a batch of {batch}, and {WHY}"):
        load_model(model)


# golden against onnxruntime's reference path -----------------------------------------------------

def _with_batch(model, batch, target=None):
    """A copy of ``model`` with the batch of its input and output set to ``batch`` by hand,
    and its Reshape target ``t`` (if any) set to ``target``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in (*copy.graph.input, *copy.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    for init in copy.graph.initializer:
        if init.name == "t":
            init.CopyFrom(onnx.numpy_helper.from_array(np.array(target, np.int64), "t"))
    return copy


def _qdq(model, calib, folder):
    """``model`` (batch 1) quantized by onnxruntime's static QDQ quantizer (int8)."""
    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": sample[None]} for sample in calib])

        def get_next(self):
            return next(self.samples, None)

    onnx.save(model, folder / "float.onnx")
    quantize_static(str(folder / "float.onnx"), str(folder / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return onnx.load(str(folder / "qdq.onnx"))


def _golden_follows_reference(model, batch, target, calib, x, folder):
    """``model`` has a fixed ``batch`` (and Reshape ``target``). Its golden output on ``x``
    equals the golden output of the model with its batch set to 1 by hand, bit for bit; and
    the fixed-batch model quantized by onnxruntime (QDQ, the batch set back to ``batch`` by
    hand) has a golden output within 1 LSB of onnxruntime's reference path on the batch-1 QDQ
    model, one sample at a time (as tests/operators/test_concat.py and
    tests/frontend/test_prequantized.py)."""
    single = _with_batch(model, 1, [1, -1])
    result = api.build(model, None, calib={"x": calib}, verilog=False, log=_quiet)
    assert result.graph.meta["batches"] == {"x": batch}
    golden = api.simulate(result, x[:, None], mode="golden")        # [S, 1, ...] samples
    by_hand = api.build(single, None, calib={"x": calib}, verilog=False, log=_quiet)
    assert np.array_equal(golden.int_outputs,
                          api.simulate(by_hand, x, mode="golden").int_outputs)
    qdq = _qdq(single, calib, folder)
    fixed = api.build(_with_batch(qdq, batch, target), None, verilog=False, log=_quiet)
    assert fixed.graph.meta["batches"] == {"x": batch}
    got = api.simulate(fixed, x, mode="golden").outputs["y"]
    (want,) = reference_outputs(qdq, {"x": x})
    scale = fixed.graph.nodes[-1].attrs["scale"]                     # the output Dequantize
    lsb = np.rint(np.abs(got.reshape(want.shape) - want) / scale)
    print(f"\nbatch {batch}: {int(np.count_nonzero(lsb))} of {lsb.size} values differ from "
          f"onnxruntime's reference path, at most {int(lsb.max())} LSB")
    assert lsb.max() <= 1
    return result


def test_fixed_batch_mlp_golden_follows_onnxruntime(tmp_path):
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((64, 16)).astype(np.float32)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    result = _golden_follows_reference(_mlp(), N, None, calib, x, tmp_path)
    assert result.graph.meta["warnings"][0] == _warning("x", N, "789444x16", "1x16")


def test_fixed_batch_conv_net_golden_follows_onnxruntime(tmp_path):
    rng = np.random.default_rng(2)
    calib = rng.standard_normal((64, 3, 8, 8)).astype(np.float32)
    x = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    _golden_follows_reference(_conv_net(64), 64, [64, -1], calib, x, tmp_path)


def test_the_warning_is_in_the_report(mlp_build):
    _, out = mlp_build
    warning = _warning("x", N, "789444x16", "1x16")
    assert warning in json.loads((out / "report.json").read_text())["warnings"]
    assert f"- {warning}" in (out / "report.md").read_text()


@pytest.mark.parametrize("layout", ["S,16", "S,1,16"])
def test_samples_stream_through_the_batch_one_program(mlp_build, layout):
    result, _ = mlp_build
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    samples = x if layout == "S,16" else x[:, None]
    golden = api.simulate(result, samples, mode="golden")
    assert golden.outputs["y"].shape[0] == 5
    one_by_one = [api.simulate(result, x[i:i + 1], mode="golden").int_outputs
                  for i in range(5)]
    assert np.array_equal(golden.int_outputs, np.concatenate(one_by_one))


# the command line ------------------------------------------------------------------------------

def test_input_shape_rebinds_the_batch_from_the_cli(tmp_path, capsys, caplog):
    model = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), model)
    rng = np.random.default_rng(4)
    np.save(tmp_path / "calib.npy", rng.standard_normal((32, 16)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal((3, 1, 16)).astype(np.float32))
    out = tmp_path / "build"
    code = main(["build", str(model), "-o", str(out), "--calib", str(tmp_path / "calib.npy"),
                 "--input-shape", "x=1x16"])
    _, err = capsys.readouterr()
    assert code == 0, err
    warning = _warning("x", N, "789444x16", "1x16")
    assert warning in caplog.text           # printed by the CLI's log handler outside pytest
    assert f"- {warning}" in (out / "report.md").read_text()
    assert "Traceback" not in err
    assert main(["sim", str(out), "--input", str(tmp_path / "x.npy"), "--golden"]) == 0
    stdout, _ = capsys.readouterr()
    assert re.match(r"3 sample\(s\) on the golden model", stdout), stdout
    code = main(["build", str(model), "-o", str(tmp_path / "other"), "--input-shape",
                 "x=2x16"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err == ("hwonnx: error: Input shape 2x16 given for 'x' contradicts the model's "
                   "789444x16 at axis 0 (a fixed batch can be rebound only to 1: hwonnx "
                   "compiles batch-1 programs)\n")


# on the RTL ---------------------------------------------------------------------------------

@pytest.mark.rtl
def test_fixed_batch_mlp_on_the_rtl_is_bit_exact(mlp_build):
    result, out = mlp_build
    x = np.random.default_rng(5).standard_normal((6, 16)).astype(np.float32)
    rtl = api.simulate(out, x, mode="compare", log=_quiet)
    assert len(rtl.cycles) == 6
    assert all(cycles == rtl.predicted_cycles for cycles in rtl.cycles)
    assert np.array_equal(rtl.int_outputs,
                          api.simulate(result, x, mode="golden").int_outputs)


@pytest.mark.rtl
def test_samples_in_the_models_own_batch_shape_are_split(tmp_path, capsys):
    """PyTorch's exported batch of 16, calibrated and simulated with data in the model's own
    input shape (S, 16, 16): the batches are split into S x 16 samples in order, which equal
    the same samples given one by one; a batch of another size is refused naming the shapes
    that are taken."""
    model = tmp_path / "mlp16.onnx"
    onnx.save(_mlp(batch=16), model)
    rng = np.random.default_rng(6)
    calib, x = (rng.standard_normal((n, 16, 16)).astype(np.float32) for n in (4, 1))
    np.save(tmp_path / "calib.npy", calib)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "x_split.npy", x.reshape(16, 16))
    out = tmp_path / "build"
    assert main(["build", str(model), "-o", str(out), "--calib",
                 str(tmp_path / "calib.npy")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["sim", str(out), "--input", str(tmp_path / "x.npy"), "--compare", "--output",
                 str(tmp_path / "y.npz")]) == 0, capsys.readouterr().err
    assert re.match(r"16 sample\(s\) on RTL: ", capsys.readouterr().out)
    assert main(["sim", str(out), "--input", str(tmp_path / "x_split.npy"), "--golden",
                 "--output", str(tmp_path / "y_split.npz")]) == 0
    with np.load(tmp_path / "y.npz") as got, np.load(tmp_path / "y_split.npz") as want:
        np.testing.assert_array_equal(got["y"], want["y"])
    np.save(tmp_path / "bad.npy", rng.standard_normal((2, 8, 16)).astype(np.float32))
    capsys.readouterr()
    assert main(["sim", str(out), "--input", str(tmp_path / "bad.npy"), "--golden"]) == 2
    assert capsys.readouterr().err == (
        f"hwonnx: error: Input file '{tmp_path / 'bad.npy'}': array 'x' has shape (2, 8, 16), "
        f"but samples of input 'x' (1, 16) need shape (S, 1, 16) or (S, 16) or (S, 16, 16) "
        f"(the model's batch of 16)\n")
