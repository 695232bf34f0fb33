"""What the tests of models quantized by onnxruntime share (tests/frontend/test_prequantized.py,
tests/frontend/test_qdq_branches.py, tests/golden/test_ort_reference.py): small float models,
quantize_static on random calibration data (QDQ and QOperator), and onnxruntime's outputs of a
quantized model."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from ort_reference import optimized_outputs, reference_outputs

__all__ = ["SAMPLES", "onnx_model", "float_model", "Reader", "dims", "quantized",
           "onnxruntime_outputs"]

SAMPLES = 64
F = TensorProto.FLOAT
ort.set_default_logger_severity(3)


def onnx_model(nodes, inits, shape, out_shape, inputs=(), out_type=F):
    """The opset-13 model of ``nodes`` from float input ``x`` of ``shape`` (and ``inputs``:
    (name, shape) pairs) to output ``y`` of ``out_shape``, ``inits`` its initializers."""
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, F, s) for n, s in (("x", shape),
                                                                         *inputs)],
        [helper.make_tensor_value_info("y", out_type, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


def float_model(kind: str, rng) -> onnx.ModelProto:
    """Small float models: Conv+Relu, a residual Conv+Add, Gemm, a CNN (Conv, Relu, Add,
    GlobalAveragePool, Flatten, Gemm), a CNN with a BatchNormalization between Conv and Relu,
    an MLP with a separate bias Add and a CNN with LeakyRelu, MaxPool and Sigmoid
    (QLinearLeakyRelu, int8 MaxPool, QLinearSigmoid in QOperator form)."""
    def w(*shape, s=0.3):
        return rng.normal(0, s, shape).astype(np.float32)
    conv = lambda i, o, name: helper.make_node("Conv", [i, f"{name}_w", f"{name}_b"], [o],  # noqa
                                               pads=[1, 1, 1, 1], name=name)
    if kind == "gemm":
        return onnx_model(
            [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="fc")],
            {"w": w(10, 24), "b": w(10, s=0.1)}, [1, 24], [1, 10])
    if kind == "mlp_bias":
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm1"),
                 helper.make_node("Add", ["m", "b1"], ["a"], name="bias1"),
                 helper.make_node("Relu", ["a"], ["r"], name="relu1"),
                 helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
        return onnx_model(nodes, {"w1": w(16, 12), "b1": w(12, s=0.2), "w2": w(12, 10, s=0.6)},
                          [1, 16], [1, 10])
    inits = {"c1_w": w(8, 3, 3, 3), "c1_b": w(8, s=0.1), "c2_w": w(8, 8, 3, 3, s=0.2),
             "c2_b": w(8, s=0.1)}
    if kind == "pool_act":
        nodes = [conv("x", "c1", "c1"),
                 helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.1, name="leaky"),
                 helper.make_node("MaxPool", ["l1"], ["p1"], kernel_shape=[2, 2],
                                  strides=[2, 2], name="pool"),
                 conv("p1", "c2", "c2"), helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig"),
                 helper.make_node("GlobalAveragePool", ["s2"], ["g"], name="gap"),
                 helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
                 helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc")]
        return onnx_model(nodes, {**inits, "fc_w": w(10, 8, s=1.0), "fc_b": w(10, s=0.1)},
                          [1, 3, 8, 8], [1, 10])
    if kind == "cnn_bn":
        inits.update(bn_scale=rng.uniform(0.5, 1.5, 8).astype(np.float32),
                     bn_bias=w(8, s=0.1), bn_mean=w(8, s=0.1),
                     bn_var=rng.uniform(0.5, 2, 8).astype(np.float32))
        nodes = [conv("x", "c1", "c1"),
                 helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias",
                                                         "bn_mean", "bn_var"], ["n1"],
                                  name="bn"),
                 helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
                 conv("r1", "c2", "c2"), helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
                 helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
                 helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
                 helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc")]
        return onnx_model(nodes, {**inits, "fc_w": w(10, 8, s=1.0), "fc_b": w(10, s=0.1)},
                          [1, 3, 8, 8], [1, 10])
    nodes = [conv("x", "c1", "c1"), helper.make_node("Relu", ["c1"], ["r1"], name="relu1")]
    if kind == "conv_relu":
        nodes[-1] = helper.make_node("Relu", ["c1"], ["y"], name="relu1")
        return onnx_model(nodes, {k: inits[k] for k in ("c1_w", "c1_b")}, [1, 3, 8, 8],
                          [1, 8, 8, 8])
    nodes += [conv("r1", "c2", "c2"), helper.make_node("Add", ["c2", "r1"], ["a"], name="add")]
    if kind == "residual":
        nodes.append(helper.make_node("Relu", ["a"], ["y"], name="relu2"))
        return onnx_model(nodes, inits, [1, 3, 8, 8], [1, 8, 8, 8])
    nodes += [helper.make_node("Relu", ["a"], ["r2"], name="relu2"),
              helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
              helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc")]
    return onnx_model(nodes, {**inits, "fc_w": w(10, 8, s=1.0), "fc_b": w(10, s=0.1)},
                      [1, 3, 8, 8], [1, 10])


class Reader(CalibrationDataReader):
    """quantize_static's calibration data: 32 normal samples of input ``x`` of ``shape``."""

    def __init__(self, shape, seed):
        rng = np.random.default_rng(seed)
        self.data = iter([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(32)])

    def get_next(self):
        return next(self.data, None)


def dims(path, output=False) -> "tuple[int, ...]":
    """The shape of the model at ``path``'s first input (its first output if ``output``)."""
    graph = onnx.load(str(path)).graph
    value = graph.output[0] if output else graph.input[0]
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


def quantized(tmp_path, kind, fmt, per_channel, act_type):
    """The path of :func:`float_model` ``kind`` quantized by quantize_static in ``fmt`` (QDQ or
    QOperator), weights int8, activations ``act_type`` (``QInt8``, ``QUInt8``, with
    ``-symmetric``: symmetric)."""
    float_path = tmp_path / f"{kind}.onnx"
    onnx.save(float_model(kind, np.random.default_rng(7)), float_path)
    path = tmp_path / f"{kind}_{fmt}_{int(per_channel)}_{act_type}.onnx"
    act_type, _, symmetric = act_type.partition("-")
    quantize_static(str(float_path), str(path), Reader(dims(float_path), 3),
                    quant_format=getattr(QuantFormat, fmt), per_channel=per_channel,
                    activation_type=getattr(QuantType, act_type), weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": bool(symmetric)})
    return path


def onnxruntime_outputs(path, x, reference=True):
    """onnxruntime's float output, int8 codes (uint8 - 128) and output DequantizeLinear scale:
    from the CPU-independent reference (``ort_reference``), or from onnxruntime's default
    session (optimized kernels, CPU-dependent) when ``reference`` is false."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]  # (+ Relu)
    scale, zp = np.float32(inits[last.input[1]]), inits[last.input[2]]
    y = (reference_outputs if reference else optimized_outputs)(model, {"x": x})[0]
    q = np.rint(y / scale).astype(np.int64) + int(zp) - (128 if zp.dtype == np.uint8 else 0)
    return y.reshape(len(x), -1), q.reshape(len(x), -1), float(scale)
