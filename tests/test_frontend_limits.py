"""hwonnx's limits (docs/spec.md, "Limits"): small files must not take unbounded memory or time,
and every refusal is one line that names the node, value or file. Each model is built here."""

import contextlib
import math
import os
import signal
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.errors import ModelError
from hwonnx.frontend import load_model, read
from spec_helpers import make_model, raises, relu_model

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


def load_time(model: onnx.ModelProto, what: str) -> float:
    with deadline(60, what):
        started = time.perf_counter()
        load_model(model)
        return time.perf_counter() - started


def assert_linear(small: onnx.ModelProto, large: onnx.ModelProto, what: str) -> None:
    """``large`` is 10x ``small``: its load may take 30x as long, not 100x (quadratic). A
    guard against quadratic blow-up only, with a wide margin; never a benchmark."""
    t_small = load_time(small, f"{what} (small)")
    t_large = load_time(large, f"{what} (10x)")
    assert t_large < 30 * max(t_small, 0.05), (t_small, t_large)


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
