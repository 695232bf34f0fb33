"""The MLPerf Tiny zoo: valid ONNX, runs in onnxruntime, and has the published MAC counts."""

import collections
import functools

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.zoo import MLPERF_TINY, count_macs, random_inputs

# Published multiply-accumulate counts (batch 1) of the MLPerf Tiny v1.0 reference models.
# External facts: these are not computed by hwonnx, they check its architectures.
MACS = {
    "ic_resnet8": 12_501_632,
    "kws_dscnn": 2_656_768,
    "vww_mobilenet": 7_489_664,
    "ad_autoencoder": 264_192,
}
SHAPES = {  # input, output
    "ic_resnet8": ([1, 3, 32, 32], [1, 10]),
    "kws_dscnn": ([1, 1, 49, 10], [1, 12]),
    "vww_mobilenet": ([1, 3, 96, 96], [1, 2]),
    "ad_autoencoder": ([1, 640], [1, 640]),
}
# Layers of the reference Keras models (github.com/mlcommons/tiny, benchmark/training/).
OPS = {
    "ic_resnet8": {"Conv": 9, "BatchNormalization": 7, "Relu": 7, "Add": 3, "AveragePool": 1,
                   "Flatten": 1, "Gemm": 1, "Softmax": 1},
    "kws_dscnn": {"Conv": 9, "BatchNormalization": 9, "Relu": 9, "AveragePool": 1,
                  "Flatten": 1, "Gemm": 1, "Softmax": 1},
    "vww_mobilenet": {"Conv": 27, "BatchNormalization": 27, "Relu": 27, "AveragePool": 1,
                      "Flatten": 1, "Gemm": 1, "Softmax": 1},
    "ad_autoencoder": {"Gemm": 10, "BatchNormalization": 9, "Relu": 9},
}
DEPTHWISE = {"ic_resnet8": 0, "kws_dscnn": 4, "vww_mobilenet": 13, "ad_autoencoder": 0}
NAMES = sorted(MLPERF_TINY)


@functools.lru_cache(maxsize=None)
def _model(name: str, seed: int = 0) -> bytes:
    return MLPERF_TINY[name](seed).SerializeToString()


def model(name: str, seed: int = 0) -> onnx.ModelProto:
    return onnx.load_from_string(_model(name, seed))


def dims(info):
    return [d.dim_value for d in info.type.tensor_type.shape.dim]


def test_registry():
    assert set(MLPERF_TINY) == set(MACS)


@pytest.mark.parametrize("name", NAMES)
def test_valid_onnx(name):
    m = model(name)
    onnx.checker.check_model(m, full_check=True)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 13)]
    (inp,), (out,) = m.graph.input, m.graph.output
    assert inp.type.tensor_type.elem_type == out.type.tensor_type.elem_type == TensorProto.FLOAT
    assert (dims(inp), dims(out)) == tuple(SHAPES[name])
    assert "mlcommons/tiny" in m.doc_string


@pytest.mark.parametrize("name", NAMES)
def test_macs_match_published(name):
    assert count_macs(model(name)) == MACS[name]


@pytest.mark.parametrize("name", NAMES)
def test_layers(name):
    m = model(name)
    assert dict(collections.Counter(n.op_type for n in m.graph.node)) == OPS[name]
    groups = [next((a.i for a in n.attribute if a.name == "group"), 1)
              for n in m.graph.node if n.op_type == "Conv"]
    assert sum(g > 1 for g in groups) == DEPTHWISE[name]


@pytest.mark.parametrize("name", NAMES)
def test_runs_in_onnxruntime(name):
    m = model(name)
    session = onnxruntime.InferenceSession(m.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    batch = random_inputs(m, samples=4, seed=1)
    assert list(batch) == ["input"]
    x = batch["input"]
    assert x.dtype == np.float32 and list(x.shape) == [4] + SHAPES[name][0]
    outputs = np.stack([session.run(None, {"input": sample})[0] for sample in x])
    assert list(outputs.shape) == [4] + SHAPES[name][1]
    assert np.isfinite(outputs).all()
    if name == "ad_autoencoder":
        assert 0.1 < outputs.std() < 100                     # neither vanished nor exploded
    else:                                                    # softmax probabilities
        np.testing.assert_allclose(outputs.sum(axis=-1), 1.0, rtol=1e-5)
        assert outputs.std(axis=-1).max() > 1e-3             # logits not all equal


def test_seeded():
    assert _model("kws_dscnn", 0) == MLPERF_TINY["kws_dscnn"](0).SerializeToString()
    assert _model("kws_dscnn", 0) != _model("kws_dscnn", 1)


def test_random_inputs_plausible():
    images = random_inputs(model("ic_resnet8"), samples=3, seed=2)["input"]
    assert images.shape == (3, 1, 3, 32, 32) and images.min() >= 0 and images.max() <= 1
    again = random_inputs(model("ic_resnet8"), samples=3, seed=2)["input"]
    np.testing.assert_array_equal(images, again)
    frames = random_inputs(model("ad_autoencoder"), samples=2, seed=0)["input"]
    assert frames.shape == (2, 1, 640) and np.isfinite(frames).all()


def test_count_macs_hand_computed():
    """Conv 2->4 (3x3, stride 2, pad 1) on 5x5 -> 3x3: 3*3*4*2*3*3 = 648; depthwise Conv
    (group 4, 3x3, pad 1) on 3x3: 3*3*4*1*3*3 = 324; Flatten -> 36; Gemm (transB) 36->10: 360;
    MatMul 10->3: 30. BatchNormalization and Relu count nothing. Total 1362."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((4, 2, 3, 3)), "w2": rng.standard_normal((4, 1, 3, 3)),
             "s": np.ones(4), "b": np.zeros(4), "m": np.zeros(4), "v": np.ones(4),
             "g": rng.standard_normal((10, 36)), "gc": np.zeros(10),
             "mm": rng.standard_normal((10, 3))}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         group=4),
        helper.make_node("Flatten", ["c2"], ["f"]),
        helper.make_node("Gemm", ["f", "g", "gc"], ["d"], transB=1),
        helper.make_node("MatMul", ["d", "mm"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "hand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    assert count_macs(m) == 648 + 324 + 360 + 30


def test_count_macs_unknown_shape():
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 2), np.float32), "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(ValueError, match="unknown"):
        count_macs(m)
