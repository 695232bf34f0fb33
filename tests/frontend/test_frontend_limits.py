"""hwonnx's limits (docs/spec.md, "Limits"): small files must not take unbounded memory or time,
and every refusal is one line that names the node, value or file. Each model is built here."""

import contextlib
import os
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hwonnx
from hwonnx.api import plan_model
from hwonnx.cli import main
from hwonnx.compiler import specs
from hwonnx.errors import ModelError, ResourceError, UnsupportedOperatorError
from hwonnx.frontend import fold, load_model, read, sparse
from hwonnx.ir import evaluate
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.ir.graph import Graph, Node, TensorType
from helpers import raises
from spec_helpers import SUPPORTED, make_model, ort_outputs, rand, relu_model

FLOAT = TensorProto.FLOAT


@contextlib.contextmanager
def deadline(seconds: float, what: str):
    """Fail instead of hanging (an unbounded read, a quadratic pass) after ``seconds``."""
    def expire(signum, frame):
        pytest.fail(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_linear(small: onnx.ModelProto, large: onnx.ModelProto, what: str) -> None:
    """``large`` is 10x ``small``: its load may take 30x the work, not 100x (quadratic),
    counted in lines of hwonnx's code executed (:func:`hwonnx_lines`), not in seconds, which
    a busy machine stretched past the margin (a CI run with a bitstream build beside it). A
    deadline still stops a load that hangs."""
    works = []
    for model, size in ((small, "small"), (large, "10x")):
        with deadline(120, f"{what} ({size})"):
            works.append(hwonnx_lines(lambda: load_model(model)))
    assert works[1] < 30 * works[0], works


# The model file ------------------------------------------------------------------------------

def test_model_file_that_is_not_a_regular_file_is_refused_by_kind(tmp_path):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    with deadline(10, "reading a FIFO"):
        with raises(ModelError, f"Cannot read model '{fifo}': it is a FIFO (named pipe), not a "
                    f"regular file"):
            load_model(fifo)
        with raises(ModelError, f"Cannot read model '{tmp_path}': it is a directory, not a "
                    f"regular file"):
            load_model(tmp_path)
        if os.path.exists("/dev/zero"):
            with raises(ModelError, "Cannot read model '/dev/zero': it is a character device, "
                        "not a regular file"):
                load_model("/dev/zero")


def test_model_file_is_read_with_a_bound_whatever_size_it_reports(monkeypatch):
    # Files under /proc report size 0; the read itself must stop at the limit.
    monkeypatch.setattr(read, "MAX_MODEL_BYTES", 16)
    path = "/proc/self/cmdline"
    if not os.path.exists(path) or os.stat(path).st_size:
        pytest.skip("needs a /proc file that reports size 0")
    with deadline(10, "reading /proc/self/cmdline"):
        with raises(ModelError, f"Cannot read model '{path}': it is larger than 16 bytes, and "
                    f"a protobuf file must be smaller than 2 GiB; store large tensors as "
                    f"external data"):
            load_model(path)


def test_external_data_file_that_is_not_a_regular_file_is_refused(tmp_path):
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 2]},
                       {"y": [1, 2]}, {"w": np.ones((2, 2), np.float32)})
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="pipe")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    onnx.save(model, tmp_path / "pipe.onnx")
    tensor.external_data[0].value = "folder"
    onnx.save(model, tmp_path / "folder.onnx")
    with deadline(10, "reading external data from a FIFO"):
        with raises(ModelError, "Initializer 'w' cannot read its external data file 'pipe': it "
                    "is a FIFO (named pipe), not a regular file"):
            load_model(tmp_path / "pipe.onnx")
    with raises(ModelError, "Initializer 'w' cannot read its external data file 'folder': it "
                "is a directory, not a regular file"):
        load_model(tmp_path / "folder.onnx")


def test_dims_whose_product_python_cannot_print_are_refused_in_one_line():
    model = relu_model()
    model.graph.initializer.append(onnx.TensorProto(name="w", data_type=FLOAT,
                                                    dims=[1 << 62] * 300, raw_data=b"\0" * 4))
    dims = ", ".join([str(1 << 62)] * 8)
    with raises(ModelError, f"Initializer 'w' has about 10^5599 elements (dims [{dims}, ...] "
                f"(300 dims)), more than hwonnx's limit of 268435456 elements or 1073741824 "
                f"bytes"):
        load_model(model)


def test_initializer_of_rank_beyond_numpys_is_refused_in_one_line(tmp_path, capsys):
    """An initializer of rank 67 (12 values: dims of 1 and [4, 3]) took a traceback from
    numpy, which holds at most 64 axes, in ``hwonnx inspect``."""
    weight = numpy_helper.from_array(rand(4, 3), "w")
    weight.dims[:] = [1] * 65 + [4, 3]
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
                       {"x": [1, 4]}, {"y": [1, 3]})
    model.graph.initializer.append(weight)
    with raises(ModelError, "Initializer 'w' has rank 67, more than hwonnx's limit of 64 axes"):
        load_model(model)
    path = tmp_path / "rank67.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["inspect", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err == ("hwonnx: error: Initializer 'w' has rank 67, more than hwonnx's limit of 64 "
                   "axes\n")


def test_values_of_rank_beyond_numpys_are_refused_by_name():
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       {"x": [1] * 65}, {"y": [1] * 65})
    with raises(ModelError, "Value 'x' has rank 65, more than hwonnx's limit of 64 axes"):
        load_model(model)
    model = make_model([helper.make_node("Reshape", ["x", "up"], ["r"], name="up"),
                        helper.make_node("Reshape", ["r", "down"], ["y"], name="down")],
                       {"x": [1, 4]}, {"y": [1, 4]},
                       {"up": np.array([1] * 64 + [4], np.int64),
                        "down": np.array([1, 4], np.int64)})
    with raises(ModelError, "Value 'r' (output of Reshape 'up') has rank 65, more than "
                            "hwonnx's limit of 64 axes"):
        load_model(model)


def test_tensor_with_two_value_fields_is_refused_even_in_a_dead_node():
    tensor = numpy_helper.from_array(np.ones(2, np.float32), "t")
    tensor.float_data.extend([1.0, 2.0])
    dead = make_model([helper.make_node("Constant", [], ["k"], value=tensor, name="k"),
                       helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, "Attribute 'value' of node 'k' stores values in both raw_data and "
                "float_data (ONNX IR: a tensor stores its values in exactly one field)"):
        load_model(dead)
    used = make_model([helper.make_node("Add", ["x", "t"], ["y"])], {"x": [1, 2]},
                      {"y": [1, 2]})
    used.graph.initializer.append(tensor)
    with raises(ModelError, "Initializer 't' stores values in both raw_data and float_data "
                "(ONNX IR: a tensor stores its values in exactly one field)"):
        load_model(used)


# Time: what must stay linear -----------------------------------------------------------------

def metadata_model(entries: int) -> onnx.ModelProto:
    model = relu_model()
    for index in range(entries):
        model.metadata_props.add(key=f"k{index % (entries // 2)}", value="v")
    return model


def test_many_metadata_props_are_checked_in_linear_time():
    assert_linear(metadata_model(10_000), metadata_model(100_000), "100,000 metadata_props")


def test_repeated_metadata_keys_are_summarized_in_one_warning():
    meta = load_model(metadata_model(10_000)).meta
    assert meta["warnings"] == (
        "5000 metadata_props keys appear more than once ('k0' (2 times), 'k1' (2 times), 'k2' "
        "(2 times) and 4997 more); the last value of each is used (ONNX IR: metadata keys "
        "should be distinct)",)


def identity_chain(length: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["v0"])]
    nodes += [helper.make_node("Identity", [f"v{i}"], [f"v{i + 1}"]) for i in range(length)]
    nodes.append(helper.make_node("Relu", [f"v{length}"], ["y"]))
    return make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]})


def test_identity_chain_is_removed_in_linear_time():
    assert_linear(identity_chain(1000), identity_chain(10_000), "a chain of 10,000 Identity")
    graph = load_model(identity_chain(10_000))
    assert [(n.op, n.inputs, n.outputs) for n in graph.nodes] == [
        ("Relu", ("x",), ("v0",)), ("Relu", ("v0",), ("y",))]


def hwonnx_lines(run) -> int:
    """The lines of hwonnx's own code that ``run()`` executes, each turn of a loop (of a
    comprehension too) counted: a measure of work that, unlike a time, depends on neither
    the machine nor its load."""
    root = os.path.dirname(hwonnx.__file__) + os.sep
    count = 0

    def line(frame, event, arg):
        nonlocal count
        count += event == "line"
        return line

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg:
                 line if frame.f_code.co_filename.startswith(root) else None)
    try:
        run()
    finally:
        sys.settrace(previous)
    return count


def scale_chain(length: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", [f"v{i}", "one"], [f"v{i + 1}"]) for i in range(length)]
    return make_model(nodes, {"v0": [1, 4]}, {f"v{length}": [1, 4]},
                      {"one": np.array(1, np.float32)})


def test_chain_of_scale_nodes_is_folded_in_linear_work():
    # Each Mul by a constant is a scale node that fold-scale folds into the one before it.
    # Each fold used to copy and rescan the whole graph: 21 s for 4,000 Muls. 20x the nodes
    # may take 40x the work, not 400x (quadratic).
    small = hwonnx_lines(lambda: load_model(scale_chain(100)))
    large = hwonnx_lines(lambda: load_model(scale_chain(2000)))
    assert large < 40 * small, (small, large)
    graph = load_model(scale_chain(2000))
    assert [(n.op, n.inputs[0], n.outputs) for n in graph.nodes] == [("Dense", "v0", ("v2000",))]


def global_pool(height: int) -> onnx.ModelProto:
    return make_model([helper.make_node("GlobalAveragePool", ["x"], ["y"], name="pool")],
                      {"x": [1, 4, height, 8]}, {"y": [1, 4, 1, 1]})


def test_pooling_of_a_tall_image_is_compiled_in_linear_work():
    # A global pool streams its kernel rows (one per image row) in passes, which were grouped
    # in time quadratic in the rows: a [1, 4, 32768, 8] input did not finish in 240 s. 16x
    # the rows may take 32x the work, not 256x.
    small, large = (hwonnx_lines(lambda: plan_model(load_model(global_pool(height)),
                                                    size="sim"))
                    for height in (128, 2048))
    assert large < 32 * small, (small, large)


def test_pooling_of_many_channels_is_refused_before_its_weights_take_gigabytes():
    # The compiler holds a layer's weights as output channels x input lanes per tap, which
    # for a pooling grows with the square of its channels: [1, 32768, 8] took 16 GiB. (A
    # Gemm's weights fill theirs: a layer of as many weights is compiled.)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="pool",
                                         kernel_shape=[2], strides=[2])],
                       {"x": [1, 8192, 8]}, {"y": [1, 8192, 4]})
    with deadline(30, "refusing a pooling of 8192 channels"):
        with raises(ResourceError, "Layer 'pool' has 8192 output channels x 1x2 taps x 8192 "
                    "input lanes of weights, 134217728 elements as the compiler holds them, of "
                    "which 16384 are its own: more than hwonnx's limit of 67108864"):
            plan_model(load_model(model), size="sim")


def test_the_weight_limit_spares_layers_whose_weights_fill_their_matrix(monkeypatch):
    monkeypatch.setattr(specs, "MAX_PHYS_ELEMENTS", 1000)
    dense = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
                       {"x": [1, 64]}, {"y": [1, 64]}, {"w": rand(64, 64)})
    plan_model(load_model(dense), size="sim")           # 4096 elements, all its own
    pool = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="pool",
                                        kernel_shape=[2], strides=[2])],
                      {"x": [1, 64, 8]}, {"y": [1, 64, 4]})
    with raises(ResourceError, "Layer 'pool' has 64 output channels x 1x2 taps x 64 input "
                "lanes of weights, 8192 elements as the compiler holds them, of which 128 are "
                "its own: more than hwonnx's limit of 1000"):
        plan_model(load_model(pool), size="sim")


# Work: values, windows, multiply-accumulates --------------------------------------------------

def test_small_pad_before_a_conv_cannot_take_gigabytes():
    # 406 bytes: a 3,000-pixel constant Pad before a 3x3 Conv, every tensor under the 2**28
    # element limit; reading it used to reach 11 GB while hwonnx inspect placed it.
    pads = np.array([0, 0, 3000, 3000, 0, 0, 3000, 3000], np.int64)
    model = make_model([helper.make_node("Pad", ["x", "pp"], ["xp"], mode="constant"),
                        helper.make_node("Conv", ["xp", "w"], ["c"]),
                        helper.make_node("GlobalAveragePool", ["c"], ["gp"]),
                        helper.make_node("Flatten", ["gp"], ["y"])],
                       {"x": [1, 2, 4, 4]}, {"y": [1, 2]},
                       {"pp": pads, "w": np.ones((2, 2, 3, 3), np.float32)})
    with deadline(30, "refusing the Pad bomb"):
        with raises(ResourceError, "Value 'xp' (output of Pad 'Pad_0') has shape [1, 2, 6004, "
                    "6004], 72096032 elements, more than hwonnx's limit of 16777216 for a "
                    "value computed at run time"):
            load_model(model)


def conv_model(x_shape, w_shape, **attrs):
    w = np.random.default_rng(0).standard_normal(w_shape).astype(np.float32)
    return make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", **attrs),
                       helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
                       helper.make_node("Flatten", ["g"], ["y"], name="flat")],
                      {"x": x_shape}, {"y": [1, w_shape[0]]}, {"w": w})


def test_conv_whose_windows_exceed_the_bound_is_refused_by_name():
    with raises(ResourceError, "Node 'conv' (Conv) reads windows of 104857600 elements per "
                "sample (output pixels x input channels x kernel taps), more than hwonnx's "
                "limit of 67108864"):
        load_model(conv_model([1, 64, 256, 256], (1, 64, 5, 5), pads=[2, 2, 2, 2]))


def test_conv_whose_multiply_accumulates_exceed_the_bound_is_refused_by_name():
    with raises(ResourceError, "Node 'conv' (Conv) takes 2415919104 multiply-accumulates per "
                "sample, more than hwonnx's limit of 1073741824"):
        load_model(conv_model([1, 16, 128, 128], (1024, 16, 3, 3), pads=[1, 1, 1, 1]))


def test_conv_whose_padded_input_exceeds_the_bound_is_refused_by_name():
    with raises(ResourceError, "Node 'conv' (Conv) pads its input of shape [1, 4, 8, 8] to "
                "[1, 4, 6008, 6008], 144384256 elements per sample, more than hwonnx's limit of "
                "16777216 for a value"):
        load_model(conv_model([1, 4, 8, 8], (1, 4, 1, 1), pads=[3000] * 4,
                              strides=[3000, 3000]))


def test_work_bounds_hold_in_the_float_evaluator_too():
    graph = Graph([Node("conv", "Conv", ("x", "w"), ("y",),
                        {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1),
                         "group": 1, "relu": False, "act_max": None})],
                  ("x",), ("y",), {"x": TensorType("float32", (1, 16, 128, 128)),
                                   "w": TensorType("float32", (1024, 16, 3, 3)),
                                   "y": TensorType("float32", (1, 1024, 126, 126))},
                  {"w": np.zeros((1024, 16, 3, 3), np.float32)})
    with raises(ResourceError, "Node 'conv' (Conv) takes 2341011456 multiply-accumulates per "
                "sample, more than hwonnx's limit of 1073741824"):
        evaluate_float(graph, {"x": np.zeros((1, 16, 128, 128), np.float32)})


@pytest.mark.parametrize("op, attrs", [
    ("Conv", {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}),
    ("MaxPool", {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
    ("AveragePool", {"kernel_shape": [2, 3], "pads": [1, 1, 0, 1], "count_include_pad": 1}),
])
def test_windows_are_evaluated_a_few_samples_at_a_time(monkeypatch, op, attrs):
    inputs = ["x", "w"] if op == "Conv" else ["x"]
    model = make_model([helper.make_node(op, inputs, ["y"], **attrs)], {"x": [1, 3, 7, 6]},
                       {"y": [None] * 4}, {"w": rand(4, 3, 3, 2)} if op == "Conv" else {})
    graph = load_model(model)
    batch = np.random.default_rng(1).standard_normal((5, 3, 7, 6)).astype(np.float32)
    whole = evaluate_float(graph, {"x": batch})["y"]
    monkeypatch.setattr(evaluate, "MAX_PATCH_ELEMENTS", 1500)    # 1 to 4 samples at a time
    np.testing.assert_array_equal(evaluate_float(graph, {"x": batch})["y"], whole)
    names, expected = ort_outputs(model, {"x": batch[:1]})
    np.testing.assert_allclose(whole[:1], expected[0], rtol=1e-5, atol=1e-5)


def test_complex_feeds_are_refused_by_name():
    graph = load_model(relu_model())
    with raises(ValueError, "Feed for graph input 'x' is complex (complex64); hwonnx evaluates "
                "real numbers only"):
        evaluate_float(graph, {"x": np.ones((1, 4), np.complex64)})


@pytest.mark.parametrize("elem, name", [(TensorProto.COMPLEX64, "complex64"),
                                        (TensorProto.COMPLEX128, "complex128")])
def test_complex_inputs_are_refused_by_name(elem, name):
    model = make_model([helper.make_node("Cast", ["x"], ["f"], to=FLOAT),
                        helper.make_node("Relu", ["f"], ["y"])], {"x": [1, 4]}, {"y": [1, 4]})
    model.graph.input[0].type.tensor_type.elem_type = elem
    with raises(ModelError, f"Graph input 'x' has {name}; hwonnx reads only float, integer and "
                f"bool tensors"):
        load_model(model)
    value = onnx.TensorProto(name="c", data_type=elem, dims=[1],
                             float_data=[1.0, 2.0] if elem == 14 else [],
                             double_data=[1.0, 2.0] if elem == 15 else [])
    constant = make_model([helper.make_node("Constant", [], ["c"], name="k", value=value),
                           helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]}, {"y": [1, 4]})
    with raises(ModelError, f"Attribute 'value' of node 'k' has {name}; hwonnx reads only "
                f"float, integer and bool tensors"):
        load_model(constant)


# Folding -------------------------------------------------------------------------------------

def outer_sum(name: str, rows: int, cols: int) -> "list[onnx.NodeProto]":
    """``name`` = a [rows, 1] + [1, cols] constant: rows x cols elements from a few stored."""
    return [helper.make_node("Add", [f"{name}_r", f"{name}_c"], [name], name=f"{name}_add")]


def outer_inits(name: str, rows: int, cols: int) -> dict:
    return {f"{name}_r": np.ones((rows, 1), np.float32),
            f"{name}_c": np.ones((1, cols), np.float32)}


def test_folding_a_constant_matmul_is_bounded_in_work():
    model = make_model(
        outer_sum("a", 2048, 2048) + outer_sum("b", 2048, 2048) +
        [helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
         helper.make_node("Gemm", ["x", "m"], ["y"], name="fc")],
        {"x": [1, 2048]}, {"y": [1, 2048]},
        {**outer_inits("a", 2048, 2048), **outer_inits("b", 2048, 2048)})
    with deadline(30, "refusing to fold a large MatMul"):
        with raises(ResourceError, "Cannot fold constant node 'mm' (MatMul): it takes "
                    "8589934592 multiply-accumulates; hwonnx folds a MatMul of at most "
                    "1073741824"):
            load_model(model)


def test_folding_a_constant_pool_is_bounded_in_work():
    model = make_model(
        outer_sum("a", 1100, 1100) +
        [helper.make_node("Reshape", ["a", "shape"], ["a4"], name="to4d"),
         helper.make_node("MaxPool", ["a4"], ["p"], name="pool", kernel_shape=[1, 1]),
         helper.make_node("Reshape", ["p", "back"], ["p2"], name="to2d"),
         helper.make_node("MatMul", ["x", "p2"], ["y"], name="fc")],
        {"x": [1, 1100]}, {"y": [1, 1100]},
        {**outer_inits("a", 1100, 1100), "shape": np.array([1, 1, 1100, 1100], np.int64),
         "back": np.array([1100, 1100], np.int64)})
    with deadline(30, "refusing to fold a large MaxPool"):
        with raises(ResourceError, "Cannot fold constant node 'pool' (MaxPool): it takes "
                    "1210000 window taps; hwonnx folds a MaxPool of at most 1048576"):
            load_model(model)


def test_folded_constants_of_a_model_are_bounded_together(monkeypatch):
    monkeypatch.setattr(fold, "MAX_FOLDED_ELEMENTS", 1000)
    model = make_model(
        outer_sum("a", 20, 30) + outer_sum("b", 20, 30) +
        [helper.make_node("Add", ["a", "b"], ["c"], name="sum"),
         helper.make_node("MatMul", ["x", "c"], ["y"], name="fc")],
        {"x": [1, 20]}, {"y": [1, 30]}, {**outer_inits("a", 20, 30), **outer_inits("b", 20, 30)})
    with raises(ResourceError, "Cannot fold constant node 'b_add' (Add): its result could have "
                "600 elements, and the constants folded before it hold 600; hwonnx folds at most "
                "1000 elements per model"):
        load_model(model)


def test_dense_tensors_made_from_sparse_ones_are_bounded_together(monkeypatch):
    monkeypatch.setattr(sparse, "MAX_DENSIFIED_ELEMENTS", 100)
    model = make_model([helper.make_node("MatMul", ["x", "a"], ["h"]),
                        helper.make_node("MatMul", ["h", "b"], ["y"])], {"x": [1, 8]},
                       {"y": [1, 8]})
    for name in "ab":
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([1.0], np.float32), name),
            numpy_helper.from_array(np.array([3], np.int64)), [8, 8]))
    with raises(ResourceError, "Sparse initializer 'b' has dims [8, 8], 64 elements, and the "
                "sparse tensors densified before it hold 64; hwonnx makes at most 100 elements "
                "of dense tensors from sparse ones per model"):
        load_model(model)


# One line, never a traceback ------------------------------------------------------------------

def test_input_with_a_dimension_of_0_is_refused_by_name():
    with raises(ModelError, "Input 'x' has shape 1x2x8x0, with no elements; every dimension of "
                "an input must be positive"):
        load_model(conv_model([1, 2, 8, 0], (4, 2, 3, 3), pads=[1, 1, 1, 1]))


def test_dilated_kernel_larger_than_the_padded_input_is_refused_by_name():
    with raises(ModelError, "Conv 'conv' has a 101x101 dilated kernel (kernel [3, 3], "
                "dilations [50, 50]), larger than its 10x10 padded input: its output would be "
                "empty"):
        load_model(conv_model([1, 2, 8, 8], (4, 2, 3, 3), pads=[1, 1, 1, 1],
                              dilations=[50, 50]))


def test_pooling_with_an_empty_output_is_refused_by_name():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                        helper.make_node("MaxPool", ["c"], ["p"], name="pool",
                                         kernel_shape=[2, 2], strides=[2, 2]),
                        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
                        helper.make_node("Gemm", ["f", "g"], ["y"], name="fc", transB=1)],
                       {"x": [1, 2, 1, 1]}, {"y": [1, 3]}, {"w": rand(4, 2, 1, 1),
                                                            "g": rand(3, 4)})
    with raises(ModelError, "MaxPool 'pool' has a 2x2 kernel, larger than its 1x1 padded input: "
                "its output would be empty"):
        load_model(model)


@pytest.mark.parametrize("auto_pad, pads", [("SAME_UPPER", [0, 0, 0, 0]),
                                            ("VALID", [1, 1, 1, 1])])
def test_auto_pad_together_with_pads_is_refused_by_name(auto_pad, pads):
    model = conv_model([1, 2, 5, 5], (2, 2, 3, 3), auto_pad=auto_pad, pads=pads)
    with raises(ModelError, f"Conv 'conv' has both auto_pad '{auto_pad}' and pads {pads}; pads "
                f"may be given only with auto_pad NOTSET (ONNX: the two attributes cannot be used "
                f"together)"):
        load_model(model)


def test_ten_thousand_unsupported_nodes_make_a_short_message():
    nodes = [helper.make_node("Sin", [f"v{i}"], [f"v{i + 1}"], name=f"erf{i}")
             for i in range(6000)]
    nodes += [helper.make_node("Expand", [f"v{i}", "index"], [f"v{i + 1}"], name=f"cut{i}")
              for i in range(6000, 10_000)]
    nodes.insert(0, helper.make_node("Relu", ["x"], ["v0"], name="relu"))
    nodes[0].output[0], nodes[1].input[0] = "r", "r"
    nodes.append(helper.make_node("Relu", ["v10000"], ["y"], name="last"))
    model = make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]},
                       {"index": np.array([1, 4], np.int64)})
    with pytest.raises(UnsupportedOperatorError) as info:
        load_model(model)
    assert str(info.value) == (
        "10000 unsupported node(s), by operator: Sin (domain 'ai.onnx', opset 17) x6000: nodes "
        "'erf0', 'erf1', 'erf2' and 5997 more; Expand (domain 'ai.onnx', opset 17) x4000: "
        "nodes 'cut6000', 'cut6001', 'cut6002' and 3997 more (Expand 'cut6000' is folded "
        "away, so its inputs must be constants, but 'v6000' is computed at run time; Expand "
        "'cut6001' is folded away, so its inputs must be constants, but 'v6001' is computed "
        "at run time; Expand 'cut6002' is folded away, so its inputs must be constants, but "
        "'v6002' is computed at run time; and 3997 more); "
        f"{SUPPORTED}")
    assert len(info.value.nodes) == 10_000


def loop_model(outputs: "list[str]", reads_outer: bool = True,
               custom: bool = False) -> onnx.ModelProto:
    """A main graph with a Loop no output depends on (a dead node); its body reads an outer
    value, or its own, or calls an operator of a domain onnx does not know."""
    step = helper.make_node("Frob", ["v"], ["v2"], domain="com.example") if custom else \
        helper.make_node("Add", ["v", "outer" if reads_outer else "v"], ["v2"])
    body = helper.make_graph(
        [step, helper.make_node("Identity", ["c"], ["c2"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", FLOAT, [1, 4])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v2", FLOAT, [1, 4])])
    return make_model([helper.make_node("Relu", ["x"], ["outer"], name="outer"),
                       helper.make_node("Loop", ["", "", "x"], outputs, body=body, name="loop"),
                       helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      {"x": [1, 4]}, {"y": [1, 4]}, opsets=[
                          helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def test_dead_node_is_checked_against_its_schema():
    with raises(ModelError, "Node 'loop' does not fit the signature of Loop in ai.onnx opset "
                "17: Node(loop) with schema(::Loop:16) has output size 0 not in range [min=1, "
                "max=2147483647]. (ONNX IR: a node's inputs, outputs and attributes MUST satisfy "
                "its operator's signature)"):
        load_model(loop_model([]))
    for reads_outer, custom in ((True, False), (False, False), (False, True)):
        graph = load_model(loop_model(["lo"], reads_outer, custom))     # valid: still read
        assert [n.name for n in graph.nodes] == ["relu"]


# Memory: at most twice the model, plus a fixed amount ------------------------------------------

MODEL_MB = 100
FIXED_HEADROOM = 128 << 20
CHILD = """
import resource, sys
from hwonnx.frontend import load_model
with open("/proc/self/statm") as stream:
    in_use = int(stream.read().split()[0]) * resource.getpagesize()
cap = in_use + 2 * int(sys.argv[2]) + int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
load_model(sys.argv[1])
print("ok")
"""


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def big_models(folder) -> "dict[str, int]":
    """Write the models of about MODEL_MB each; return their sizes (with external data)."""
    size = MODEL_MB << 20
    weight = np.ones((1000, size // 4000), np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 1000]},
                       {"y": [1, weight.shape[1]]}, {"w": weight})
    onnx.save(model, folder / "inline.onnx")
    onnx.save(model, folder / "external.onnx", save_as_external_data=True,
              location="external.bin")
    with open(folder / "unknown.onnx", "wb") as stream:       # field 99: unknown to onnx
        stream.write(relu_model().SerializeToString())
        stream.write(varint(99 << 3 | 2) + varint(size))
        stream.write(bytes(size))
    return {"inline.onnx": os.path.getsize(folder / "inline.onnx"),
            "external.onnx": os.path.getsize(folder / "external.onnx") +
            os.path.getsize(folder / "external.bin"),
            "unknown.onnx": os.path.getsize(folder / "unknown.onnx")}


def test_loading_takes_at_most_twice_the_model_in_memory(tmp_path):
    for name, size in big_models(tmp_path).items():
        result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / name), str(size),
                                 str(FIXED_HEADROOM)], capture_output=True, text=True,
                                timeout=120)
        assert (result.returncode, result.stdout) == (0, "ok\n"), (name, result.stderr[-2000:])
