"""The models of the host-step tests (tests/host_steps/test_segments.py and others): graphs
with host steps in the middle, so programs of several segments, and the build of each."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build

from helpers import quiet
from rtl_helpers import he_weight

__all__ = ["onnx_model", "conv_node", "softmax_middle", "div_computed", "skip_across",
           "three_segments", "MODELS", "segmented_build", "scale_of"]


def onnx_model(nodes, inits, inputs, outputs, extra_outputs=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "segments",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    graph.output.extend(extra_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def conv_node(name, x, w, y, bias=None, **attrs):
    return helper.make_node("Conv", [x, w] + ([bias] if bias else []), [y], name=name, **attrs)


def softmax_middle(rng):
    """``x`` [1, 3, 8, 8] -> Conv + Relu ``f1`` -> Softmax over channels ``s`` -> Conv ``y``."""
    inits = {"w1": he_weight(rng, 8, 3, 3, 3), "b1": rng.normal(0, 0.1, 8),
             "w2": he_weight(rng, 4, 8, 3, 3, gain=4.0)}
    nodes = [conv_node("conv1", "x", "w1", "c1", "b1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["f1"], name="relu1"),
             helper.make_node("Softmax", ["f1"], ["s"], name="softmax", axis=1),
             conv_node("conv2", "s", "w2", "y", pads=[1] * 4)]
    return onnx_model(nodes, inits, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]})


def div_computed(rng):
    """``q = a / (relu(b) + 1)`` of two convolutions of ``x`` [1, 3, 6, 6], then a 1x1 Conv."""
    inits = {"wa": he_weight(rng, 4, 3, 3, 3), "wb": he_weight(rng, 4, 3, 1, 1),
             "one": np.float32(1.0), "wy": he_weight(rng, 2, 4, 1, 1)}
    nodes = [conv_node("conv_a", "x", "wa", "a", pads=[1] * 4),
             conv_node("conv_b", "x", "wb", "b"),
             helper.make_node("Relu", ["b"], ["rb"], name="relu_b"),
             helper.make_node("Add", ["rb", "one"], ["d"], name="add_one"),
             helper.make_node("Div", ["a", "d"], ["q"], name="div"),
             conv_node("conv_y", "q", "wy", "y")]
    return onnx_model(nodes, inits, {"x": [1, 3, 6, 6]}, {"y": [1, 2, 6, 6]})


def skip_across(rng):
    """A residual Add of ``f1`` (made before a Softmax) and ``g`` (made after it): ``f1``
    crosses the boundary, read back after segment 1 and written again into segment 2."""
    inits = {"w1": he_weight(rng, 8, 3, 3, 3), "w2": he_weight(rng, 8, 8, 3, 3, gain=4.0)}
    nodes = [conv_node("conv1", "x", "w1", "c1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["f1"], name="relu1"),
             helper.make_node("Softmax", ["f1"], ["s"], name="softmax", axis=1),
             conv_node("conv2", "s", "w2", "g", pads=[1] * 4),
             helper.make_node("Add", ["g", "f1"], ["y"], name="residual")]
    return onnx_model(nodes, inits, {"x": [1, 3, 6, 6]}, {"y": [1, 8, 6, 6]})


def three_segments(rng):
    """Three segments, two outputs: ``f1`` (segment 1's Conv + Relu, also read by the host's
    Softmax) and ``probs``, a Softmax at the end of Gemm logits after a LogSoftmax and a
    Conv, global pooling and Flatten."""
    inits = {"w1": he_weight(rng, 6, 3, 3, 3), "w2": he_weight(rng, 6, 6, 3, 3, gain=4.0),
             "w3": he_weight(rng, 4, 6, 1, 1), "wc": he_weight(rng, 3, 4).T.copy(),
             "bc": rng.normal(0, 0.1, 3)}
    nodes = [conv_node("conv1", "x", "w1", "c1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["f1"], name="relu1"),
             helper.make_node("Softmax", ["f1"], ["s"], name="softmax", axis=1),
             conv_node("conv2", "s", "w2", "c2", pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["g"], name="relu2"),
             helper.make_node("LogSoftmax", ["g"], ["l"], name="logsoftmax", axis=1),
             conv_node("conv3", "l", "w3", "h"),
             helper.make_node("GlobalAveragePool", ["h"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "wc", "bc"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="final", axis=1)]
    return onnx_model(nodes, inits, {"x": [1, 3, 6, 6]},
                      {"f1": [1, 6, 6, 6], "probs": [1, 3]})


MODELS = {"softmax_middle": softmax_middle, "div_computed": div_computed,
          "skip_across": skip_across, "three_segments": three_segments}
def segmented_build(name, tmp_path, config=None, count=4):
    rng = np.random.default_rng(sorted(MODELS).index(name))
    model = MODELS[name](rng)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    calib = rng.uniform(-1, 1, (64, *shape[1:])).astype(np.float32)
    result = build(model, tmp_path / name, calib={"x": calib}, config=config, log=quiet,
                   verilog=False)
    return model, result, {"x": calib[:count]}


def scale_of(graph, value: str) -> float:
    node = next(n for n in graph.nodes if n.op == "Dequantize" and n.outputs[0] == value)
    return float(node.attrs["scale"])
