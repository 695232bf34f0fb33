"""Small networks laid out the way real exporters write them (seeded random weights, built with
the onnx helper API; no framework at run time): what users bring, not what hwonnx prefers.

* :func:`keras_nhwc_cnn`: tf2onnx from Keras: NHWC input, a Transpose pair around every Conv
  and its Relu (tf2onnx keeps the model channels-last), and Keras's Flatten of an NHWC tensor
  (Transpose to NHWC, Reshape) before the MatMul + Add of a Dense, then Softmax.
* :func:`torch_mlp_bn1d`: PyTorch ``Linear -> BatchNorm1d -> ReLU`` blocks exported with a fixed
  batch of 8 (``Gemm(transB=1)``, ``Unsqueeze -> BatchNormalization -> Squeeze``).
* :func:`autoencoder_two_outputs`: a PyTorch-style dense autoencoder (``Gemm`` + ``Relu``) that
  returns both its code and its reconstruction: two graph outputs, the code also read by the
  decoder.
* :func:`tiny_unet`: a two-level U-Net: encoder convolutions and max pooling, a decoder with a
  nearest ``Resize`` x2 + Conv at one level and a ``ConvTranspose`` k2 s2 at the other, skip
  connections as channel ``Concat``, a 1x1 output convolution.

* :func:`mobilenet_v3_style`: PyTorch MobileNetV3-small blocks: HardSwish, depthwise
  convolutions, a squeeze-and-excitation gate (GlobalAveragePool, 1x1 Convs, HardSigmoid,
  ``Mul`` of the feature map by the per-channel gate), a residual Add, a classifier.
* :func:`tiny_yolo_style`: a YOLOv8-style detector: Conv + SiLU (``Sigmoid`` and ``Mul``, as
  PyTorch exports it), a C2f block (``Split`` in two, a bottleneck, ``Concat``), a nearest
  ``Resize`` x2 and a skip ``Concat`` in the neck, two detection heads (two graph outputs).

* :func:`audio_cnn_1d`: a PyTorch ``Conv1d`` keyword spotter on 8 MFCC features x 64 frames
  (``[N, C, L]`` tensors): Conv1d, BatchNorm1d, ReLU, MaxPool1d, a strided Conv1d, a global
  average pool and a Linear classifier.

:data:`EXPORTER_STYLE` maps names to builders ``fn(seed=0) -> onnx.ModelProto``.
"""

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["EXPORTER_STYLE", "audio_cnn_1d", "autoencoder_two_outputs", "keras_nhwc_cnn",
           "mobilenet_v3_style", "tiny_unet", "tiny_yolo_style", "torch_mlp_bn1d"]


class _Graph:
    """Collects nodes and initializers; names values ``<kind>_<n>`` like exporters do."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng([seed, 7])
        self.nodes, self.inits, self.count = [], [], 0

    def const(self, array, dtype=np.float32) -> str:
        name = f"const_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array, dtype), name))
        return name

    def node(self, op: str, inputs, **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{op}_{self.count}",
                                           **attrs))
        return out

    def he(self, shape, fan_in: int) -> str:
        return self.const(self.rng.normal(0, math.sqrt(2.0 / fan_in), shape))

    def small(self, shape) -> str:
        return self.const(self.rng.normal(0, 0.05, shape))

    def model(self, name: str, inputs, outputs, opset: int, doc: str) -> onnx.ModelProto:
        """The model; the last node writes the first output (the others are named already)."""
        self.nodes[-1].output[0] = outputs[0][0]
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
            self.inits, doc_string=doc)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                 ir_version=8, producer_name="hwonnx.zoo", doc_string=doc)


def keras_nhwc_cnn(seed: int = 0) -> onnx.ModelProto:
    """tf2onnx-style channels-last CNN on 16x16x3 images, 10 classes (module docstring)."""
    g = _Graph(seed)
    x = g.node("Transpose", ["input"], perm=[0, 3, 1, 2])            # NHWC -> NCHW
    channels = 3
    for cout, stride in ((8, 1), (16, 2), (16, 2)):
        w = g.he((cout, channels, 3, 3), channels * 9)
        pads = [1, 1, 1, 1] if stride == 1 else [0, 0, 1, 1]          # Keras 'same'
        x = g.node("Conv", [x, w, g.small((cout,))], strides=[stride, stride], pads=pads)
        x = g.node("Transpose", [x], perm=[0, 2, 3, 1])              # back to NHWC
        x = g.node("Relu", [x])
        x = g.node("Transpose", [x], perm=[0, 3, 1, 2])              # the next Conv's NCHW
        channels = cout
    x = g.node("Transpose", [x], perm=[0, 2, 3, 1])                  # Keras Flatten: NHWC
    x = g.node("Reshape", [x, g.const([1, -1], np.int64)])
    x = g.node("MatMul", [x, g.he((16 * 4 * 4, 10), 256)])
    x = g.node("Add", [x, g.small((10,))])
    g.node("Softmax", [x], axis=-1)
    return g.model("keras_nhwc_cnn", [("input", [1, 16, 16, 3])], [("output", [1, 10])], 13,
                   keras_nhwc_cnn.__doc__)


def torch_mlp_bn1d(seed: int = 0, batch: int = 8) -> onnx.ModelProto:
    """PyTorch-style MLP (20 -> 32 -> 32 -> 4) with BatchNorm1d, exported with a fixed batch."""
    g = _Graph(seed)
    x, width = "input", 20
    for out in (32, 32):
        x = g.node("Gemm", [x, g.he((out, width), width), g.small((out,))], transB=1)
        x = g.node("Unsqueeze", [x, g.const([2], np.int64)])
        x = g.node("BatchNormalization", [
            x, g.const(g.rng.uniform(0.6, 1.4, out)), g.const(g.rng.normal(0, 0.2, out)),
            g.const(g.rng.normal(0, 0.3, out)), g.const(g.rng.uniform(0.5, 2.0, out))],
            epsilon=1e-5)
        x = g.node("Squeeze", [x, g.const([2], np.int64)])
        x = g.node("Relu", [x])
        width = out
    g.node("Gemm", [x, g.he((4, width), width), g.small((4,))], transB=1)
    return g.model("torch_mlp_bn1d", [("input", [batch, 20])], [("output", [batch, 4])], 13,
                   torch_mlp_bn1d.__doc__)


def autoencoder_two_outputs(seed: int = 0) -> onnx.ModelProto:
    """A 64 -> 32 -> 8 -> 32 -> 64 dense autoencoder returning (reconstruction, code)."""
    g = _Graph(seed)
    x, width = "input", 64
    for out in (32, 8):
        x = g.node("Relu", [g.node("Gemm", [x, g.he((out, width), width), g.small((out,))],
                                   transB=1)])
        width = out
    g.nodes[-1].output[0] = x = "code"
    for out in (32, 64):
        x = g.node("Gemm", [x, g.he((out, width), width), g.small((out,))], transB=1)
        if out != 64:
            x = g.node("Relu", [x])
        width = out
    return g.model("autoencoder_two_outputs", [("input", [1, 64])],
                   [("reconstruction", [1, 64]), ("code", [1, 8])], 13,
                   autoencoder_two_outputs.__doc__)


def audio_cnn_1d(seed: int = 0) -> onnx.ModelProto:
    """A 1-D CNN on [1, 8, 64] audio features, 5 classes (module docstring)."""
    g = _Graph(seed)
    x = g.node("Conv", ["input", g.he((16, 8, 3), 24), g.small((16,))], pads=[1, 1])
    x = g.node("BatchNormalization", [
        x, g.const(g.rng.uniform(0.6, 1.4, 16)), g.const(g.rng.normal(0, 0.2, 16)),
        g.const(g.rng.normal(0, 0.3, 16)), g.const(g.rng.uniform(0.5, 2.0, 16))], epsilon=1e-5)
    x = g.node("MaxPool", [g.node("Relu", [x])], kernel_shape=[2], strides=[2])       # 32
    x = g.node("Relu", [g.node("Conv", [x, g.he((16, 16, 3), 48), g.small((16,))],
                               pads=[1, 1], strides=[2])])                           # 16
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    g.node("Gemm", [x, g.he((5, 16), 16), g.small((5,))], transB=1)
    return g.model("audio_cnn_1d", [("input", [1, 8, 64])], [("output", [1, 5])], 13,
                   audio_cnn_1d.__doc__)


def tiny_unet(seed: int = 0) -> onnx.ModelProto:
    """A two-level U-Net on 1x16x16 inputs with a 2-channel 16x16 output (module docstring)."""
    g = _Graph(seed)

    def conv(x, cin, cout, k=3):
        pad = k // 2
        x = g.node("Conv", [x, g.he((cout, cin, k, k), cin * k * k), g.small((cout,))],
                   pads=[pad] * 4)
        return g.node("Relu", [x])

    e1 = conv(conv("input", 1, 8), 8, 8)                              # 16x16
    e2 = conv(g.node("MaxPool", [e1], kernel_shape=[2, 2], strides=[2, 2]), 8, 16)    # 8x8
    b = conv(g.node("MaxPool", [e2], kernel_shape=[2, 2], strides=[2, 2]), 16, 16)    # 4x4
    up = g.node("Resize", [b, "", g.const([1, 1, 2, 2])], mode="nearest")            # 8x8
    d2 = conv(g.node("Concat", [e2, conv(up, 16, 16)], axis=1), 32, 16)
    w = g.he((16, 8, 2, 2), 16 * 4)                                   # ConvTranspose [C, M, ..]
    up = g.node("ConvTranspose", [d2, w, g.small((8,))], strides=[2, 2])              # 16x16
    d1 = conv(g.node("Concat", [e1, g.node("Relu", [up])], axis=1), 16, 8)
    g.node("Conv", [d1, g.he((2, 8, 1, 1), 8), g.small((2,))])
    return g.model("tiny_unet", [("input", [1, 1, 16, 16])], [("output", [1, 2, 16, 16])], 13,
                   tiny_unet.__doc__)


def _conv_act(g: _Graph, x: str, cin: int, cout: int, k: int = 3, stride: int = 1,
              group: int = 1, act: "str | None" = None) -> str:
    pad = k // 2
    x = g.node("Conv", [x, g.he((cout, cin // group, k, k), cin // group * k * k),
                        g.small((cout,))], pads=[pad] * 4, strides=[stride, stride],
               group=group)
    if act == "silu":                                   # PyTorch's SiLU: Sigmoid and Mul
        return g.node("Mul", [x, g.node("Sigmoid", [x])])
    return g.node(act, [x]) if act else x


def mobilenet_v3_style(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV3-small-style blocks on 3x32x32 images, 10 classes (module docstring)."""
    g = _Graph(seed)
    x = _conv_act(g, "input", 3, 16, stride=2, act="HardSwish")                   # 16x16
    y = _conv_act(g, x, 16, 16, group=16, act="Relu")                             # depthwise
    s = g.node("GlobalAveragePool", [y])
    s = _conv_act(g, s, 16, 8, k=1, act="Relu")
    s = g.node("HardSigmoid", [_conv_act(g, s, 8, 16, k=1)], alpha=1 / 6, beta=0.5)
    y = g.node("Mul", [y, s])                                 # the SE gate, per channel
    y = _conv_act(g, y, 16, 16, k=1)
    x = g.node("Add", [x, y])                                 # residual
    x = _conv_act(g, x, 16, 32, k=1, act="HardSwish")
    x = _conv_act(g, x, 32, 32, stride=2, group=32, act="HardSwish")              # 8x8
    x = _conv_act(g, x, 32, 24, k=1)
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    x = g.node("HardSwish", [g.node("Gemm", [x, g.he((32, 24), 24), g.small((32,))],
                                    transB=1)])
    g.node("Gemm", [x, g.he((10, 32), 32), g.small((10,))], transB=1)
    return g.model("mobilenet_v3_style", [("input", [1, 3, 32, 32])], [("output", [1, 10])],
                   14, mobilenet_v3_style.__doc__)


def tiny_yolo_style(seed: int = 0) -> onnx.ModelProto:
    """A YOLOv8-style detector on 3x32x32 images: heads at 8x8 and 16x16 (module
    docstring), each 3 anchors x (4 box + 1 objectness + 2 classes) channels."""
    g = _Graph(seed)
    x = _conv_act(g, "input", 3, 8, stride=2, act="silu")                         # 16x16
    p3 = _conv_act(g, x, 8, 16, stride=1, act="silu")
    x = _conv_act(g, p3, 16, 16, stride=2, act="silu")                            # 8x8
    a, b = (f"split_{i}" for i in range(2))                   # C2f: split, bottleneck, concat
    g.nodes.append(helper.make_node("Split", [x, g.const([8, 8], np.int64)], [a, b], axis=1,
                                    name="Split_c2f"))
    m = _conv_act(g, _conv_act(g, b, 8, 8, act="silu"), 8, 8, act="silu")
    m = g.node("Add", [b, m])
    p4 = _conv_act(g, g.node("Concat", [a, b, m], axis=1), 24, 16, k=1, act="silu")
    head = "head_8x8"
    _conv_act(g, p4, 16, 21, k=1)
    g.nodes[-1].output[0] = head
    up = g.node("Resize", [p4, "", g.const([1, 1, 2, 2])], mode="nearest")      # 16x16
    n3 = _conv_act(g, g.node("Concat", [up, p3], axis=1), 32, 16, act="silu")
    _conv_act(g, n3, 16, 21, k=1)
    return g.model("tiny_yolo_style", [("input", [1, 3, 32, 32])],
                   [("head_16x16", [1, 21, 16, 16]), (head, [1, 21, 8, 8])], 13,
                   tiny_yolo_style.__doc__)


EXPORTER_STYLE = {"keras_nhwc_cnn": keras_nhwc_cnn, "torch_mlp_bn1d": torch_mlp_bn1d,
                  "tiny_unet": tiny_unet, "autoencoder_two_outputs": autoencoder_two_outputs,
                  "mobilenet_v3_style": mobilenet_v3_style, "tiny_yolo_style": tiny_yolo_style,
                  "audio_cnn_1d": audio_cnn_1d}
