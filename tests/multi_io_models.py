"""Float ONNX models with several inputs or several outputs, shared by the multi-input/output
tests (tests/end_to_end/test_multi_io.py, tests/end_to_end/test_multi_io_rtl.py). Each maker
takes a NumPy generator and returns the model and its input shapes (batch axis of 1 first)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inits, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "multi_io",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _weight(rng, *shape, gain=1.0) -> np.ndarray:
    fan_in = int(np.prod(shape[1:]))
    return rng.normal(0, gain * (2 / fan_in) ** 0.5, shape).astype(np.float32)


def two_images_concat(rng, host=False):
    """Two images of different channel counts (``a`` [1, 3, 6, 5], ``b`` [1, 2, 6, 5]), each
    through its own Conv (+ Relu on ``a``), joined by a channel Concat and mixed by a 3x3 Conv.
    With ``host``, each input has its own steps on the host first: ``a`` comes channels-last
    ([1, 6, 5, 3], transposed to NCHW), ``b`` is normalized ((b - mean) / std per channel)."""
    inits = {"wa": _weight(rng, 4, 3, 3, 3), "wb": _weight(rng, 5, 2, 1, 1, gain=2.0),
             "wm": _weight(rng, 3, 9, 3, 3), "bm": rng.normal(0, 0.1, 3)}
    nodes = [helper.make_node("Conv", ["at" if host else "a", "wa"], ["ca"], name="conv_a",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["ca"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["bn" if host else "b", "wb"], ["cb"], name="conv_b"),
             helper.make_node("Concat", ["ra", "cb"], ["cat"], name="concat", axis=1),
             helper.make_node("Conv", ["cat", "wm", "bm"], ["y"], name="mix",
                              pads=[1, 1, 1, 1])]
    if host:
        inits.update(mean=np.array([0.5, -0.25]).reshape(1, 2, 1, 1),
                     std=np.array([2.0, 0.5]).reshape(1, 2, 1, 1))
        nodes[:0] = [helper.make_node("Transpose", ["a"], ["at"], name="nchw_a",
                                      perm=[0, 3, 1, 2]),
                     helper.make_node("Sub", ["b", "mean"], ["bc"], name="center_b"),
                     helper.make_node("Div", ["bc", "std"], ["bn"], name="scale_b")]
    shapes = {"a": (1, 6, 5, 3) if host else (1, 3, 6, 5), "b": (1, 2, 6, 5)}
    return _model(nodes, inits, shapes, {"y": [1, 3, 6, 5]}), shapes


def two_vectors_residual(rng, sum_out=False):
    """A residual Add of two computed vectors: ``u`` [1, 12] through a Gemm, ``v`` [1, 7]
    through a Gemm + Relu, added, then a last Gemm (the inputs are placed side by side). With
    ``sum_out``, the sum ``s`` (read by the last Gemm) is an output too."""
    inits = {"wu": _weight(rng, 12, 10), "wv": _weight(rng, 7, 10, gain=3.0),
             "bv": rng.normal(0, 0.3, 10), "wo": _weight(rng, 10, 6)}
    nodes = [helper.make_node("Gemm", ["u", "wu"], ["gu"], name="fc_u"),
             helper.make_node("Gemm", ["v", "wv", "bv"], ["gv"], name="fc_v"),
             helper.make_node("Relu", ["gv"], ["rv"], name="relu_v"),
             helper.make_node("Add", ["gu", "rv"], ["s"], name="residual"),
             helper.make_node("Gemm", ["s", "wo"], ["y"], name="fc_out")]
    outputs = {"s": [1, 10], "y": [1, 6]} if sum_out else {"y": [1, 6]}
    return _model(nodes, inits, {"u": [1, 12], "v": [1, 7]}, outputs), {"u": (1, 12), "v": (1, 7)}


def autoencoder(rng):
    """One input, two outputs: ``x`` [1, 16] -> encoder Gemm + Relu -> ``code`` [1, 5] (a
    graph output, and read by the decoder) -> decoder Gemm -> ``recon`` [1, 16]."""
    inits = {"we": _weight(rng, 16, 5), "be": rng.normal(0, 0.2, 5), "wd": _weight(rng, 5, 16),
             "bd": rng.normal(0, 0.1, 16)}
    nodes = [helper.make_node("Gemm", ["x", "we", "be"], ["h"], name="encoder"),
             helper.make_node("Relu", ["h"], ["code"], name="relu_code"),
             helper.make_node("Gemm", ["code", "wd", "bd"], ["recon"], name="decoder")]
    return (_model(nodes, inits, {"x": [1, 16]}, {"code": [1, 5], "recon": [1, 16]}),
            {"x": (1, 16)})


def two_heads(rng, host=True):
    """A detector-like network: ``x`` [1, 3, 8, 8] -> Conv + Relu ``f1`` -> strided Conv + Relu
    ``f2`` (a graph output, also read by the classifier). Head ``boxes``: a 1x1 Conv on
    ``f1``. Classifier on ``f2``: GlobalAveragePool, Flatten, Gemm ``logits``. With ``host``,
    a Softmax of the logits (``probs``) and an ArgMax of the boxes across channels
    (``box_class``, int64 [1, 1, 8, 8], beside ``boxes``) run on the host; else ``logits`` itself
    is the output."""
    inits = {"w1": _weight(rng, 6, 3, 3, 3), "w2": _weight(rng, 8, 6, 3, 3),
             "wb": _weight(rng, 4, 6, 1, 1), "bb": rng.normal(0, 0.1, 4),
             "wc": _weight(rng, 8, 5, gain=2.0), "bc": rng.normal(0, 0.1, 5)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["f1"], name="relu1"),
             helper.make_node("Conv", ["f1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["f2"], name="relu2"),
             helper.make_node("Conv", ["f1", "wb", "bb"], ["boxes"], name="box_head"),
             helper.make_node("GlobalAveragePool", ["f2"], ["pooled"], name="pool"),
             helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "wc", "bc"], ["logits"], name="classifier")]
    outputs = {"boxes": [1, 4, 8, 8], "f2": [1, 8, 4, 4]}
    if host:
        nodes += [helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
                  helper.make_node("ArgMax", ["boxes"], ["box_class"], name="argmax", axis=1)]
        outputs.update(probs=[1, 5])
    else:
        outputs.update(logits=[1, 5])
    model = _model(nodes, inits, {"x": [1, 3, 8, 8]}, outputs)
    if host:
        model.graph.output.append(helper.make_tensor_value_info("box_class", TensorProto.INT64,
                                                                [1, 1, 8, 8]))
    return model, {"x": (1, 3, 8, 8)}


MODELS = {"two_images_concat": two_images_concat, "two_vectors_residual": two_vectors_residual,
          "autoencoder": autoencoder, "two_heads": two_heads}


def samples(rng, shapes: "dict[str, tuple]", count: int) -> "dict[str, np.ndarray]":
    """``count`` samples per input, ``[count, *shape]`` (the batch axis of 1 kept)."""
    return {name: rng.uniform(-1, 1, (count, *shape)).astype(np.float32)
            for name, shape in shapes.items()}


def input_and_result(rng):
    """The graph input ``x`` [1, 8] is also a graph output, beside a Gemm ``y`` of it."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")]
    return _model(nodes, {"w": _weight(rng, 8, 4)}, {"x": [1, 8]},
                  {"x": [1, 8], "y": [1, 4]}), {"x": (1, 8)}


def map_and_flattened(rng):
    """A Conv map ``c`` [1, 4, 3, 3] and its Flatten ``f`` [1, 36] are both outputs (two
    outputs of one placement)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Flatten", ["c"], ["f"], name="flatten")]
    return _model(nodes, {"w": _weight(rng, 4, 2, 1, 1)}, {"x": [1, 2, 3, 3]},
                  {"c": [1, 4, 3, 3], "f": [1, 36]}), {"x": (1, 2, 3, 3)}


def inputs_added(rng):
    """A residual Add of the two inputs themselves (``x``, ``z`` [1, 8]), then a Gemm."""
    nodes = [helper.make_node("Add", ["x", "z"], ["s"], name="add"),
             helper.make_node("Gemm", ["s", "w"], ["y"], name="fc")]
    return _model(nodes, {"w": _weight(rng, 8, 4)}, {"x": [1, 8], "z": [1, 8]},
                  {"y": [1, 4]}), {"x": (1, 8), "z": (1, 8)}
