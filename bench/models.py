"""Benchmark workloads built with the onnx helper API (seeded random weights)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["conv_layer_model", "mlp_model", "calibration"]


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def conv_layer_model(seed: int = 0, channels_in: int = 16, channels_out: int = 32,
                     size: int = 32) -> onnx.ModelProto:
    """One 3x3 convolution, pad 1, with bias and ReLU: ``[1, Cin, S, S] -> [1, Cout, S, S]``."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, (2.0 / (9 * channels_in)) ** 0.5, (channels_out, channels_in, 3, 3))
    b = rng.normal(0, 0.1, channels_out)
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"),
             numpy_helper.from_array(b.astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes,
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                 [1, channels_in, size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                 [1, channels_out, size, size])], inits)


def mlp_model(seed: int = 0, sizes=(784, 256, 128, 10)) -> onnx.ModelProto:
    """A multilayer perceptron of Gemm + ReLU layers."""
    rng = np.random.default_rng(seed)
    nodes, inits, value = [], [], "x"
    for i, (k, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        inits += [numpy_helper.from_array(
                      rng.normal(0, (2.0 / k) ** 0.5, (k, n)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), f"b{i}")]
        last = i == len(sizes) - 2
        out = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [value, f"w{i}", f"b{i}"],
                                      [out if last else f"g{i}"], name=f"fc{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out], name=f"relu{i}"))
        value = out
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, sizes[0]])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, sizes[-1]])],
                  inits)


def calibration(model: onnx.ModelProto, samples: int, seed: int = 1) -> "dict[str, np.ndarray]":
    """Random non-negative inputs (like images) for calibration and simulation."""
    rng = np.random.default_rng(seed)
    result = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        result[value.name] = rng.uniform(0, 1, [samples] + shape[1:]).astype(np.float32)
    return result
