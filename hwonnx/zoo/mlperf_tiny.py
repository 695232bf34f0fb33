"""The four MLPerf Tiny v1.0 reference models as ONNX graphs with seeded random weights.

Each builder follows the Keras reference training code of github.com/mlcommons/tiny and
lays the graph out the way a Keras -> ONNX export does (NCHW, batch 1, float32, opset 13):
``Conv`` with explicit ``pads`` (Keras ``padding='same'``: the odd pixel of padding goes at
the end), a separate ``BatchNormalization`` after each conv or dense layer that has one,
``Relu``, ``Add`` for residuals, depthwise convs as ``Conv`` with ``group`` = channels,
``AveragePool``, ``Flatten``, ``Gemm`` for dense layers (``B`` stored [K, N] like a Keras
kernel) and ``Softmax`` where the reference has one. Dropout is an identity at inference
and is left out.

Weights are He-normal; biases small. Batch-norm statistics are data-dependent, as in a
trained model: the builder runs the graph eagerly in NumPy on a few :func:`random_inputs`
samples and sets each layer's moving mean / variance to the measured per-channel statistics,
randomly perturbed (variance times U(0.7, 1.4), gamma U(0.6, 1.4), beta N(0, 0.2)), so
activations stay O(1) through the network for plausible inputs.

:func:`count_macs` counts multiply-accumulates of Conv / Gemm / MatMul from shape inference;
for the four models it gives the published MLPerf Tiny figures (see ``MACS`` in the tests).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MLPERF_TINY", "Net", "autoencoder", "conv_bn_relu", "count_macs", "ds_cnn",
           "mobilenet_v1_025", "random_inputs", "resnet8"]

_OPSET = 13
_IR_VERSION = 8
_BN_EPSILON = 1e-3          # Keras BatchNormalization default
_CALIB_SAMPLES = 32         # samples the builder uses to set batch-norm statistics
_REPO = "https://github.com/mlcommons/tiny/blob/master/"


class Net:
    """Eager graph builder: appends ONNX nodes and computes each value on calibration data."""

    def __init__(self, name: str, seed: int, input_shape: "tuple[int, ...]", doc: str,
                 samples: int = _CALIB_SAMPLES):
        self.name, self.doc = name, doc
        self.rng = np.random.default_rng([seed, 0])
        self.input_shape = tuple(input_shape)
        data = _plausible(self.input_shape, samples, np.random.default_rng([seed, 1]))
        self.values = {"input": data.reshape((samples,) + self.input_shape[1:])}
        self.nodes: "list[onnx.NodeProto]" = []
        self.inits: "list[onnx.TensorProto]" = []
        self.counts: "dict[str, int]" = {}

    def _new(self, kind: str) -> str:
        index = self.counts.get(kind, 0)
        self.counts[kind] = index + 1
        return f"{kind}_{index}"

    def _const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def _emit(self, kind: str, op: str, inputs: "list[str]", value: np.ndarray, **attrs) -> str:
        name = self._new(kind)
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        self.values[name] = value.astype(np.float32)
        return name

    def conv(self, x: str, cout: int, kernel: "tuple[int, int]", stride: int = 1,
             depthwise: bool = False) -> str:
        """Keras ``Conv2D`` / ``DepthwiseConv2D`` (``cout`` ignored) with ``padding='same'``
        and a bias."""
        v = self.values[x]
        cin, size = v.shape[1], v.shape[2:]
        group = cin if depthwise else 1
        cout = cin if depthwise else cout
        pads = _same_pads(size, kernel, stride)
        fan_in = (cin // group) * kernel[0] * kernel[1]
        w = self.rng.normal(0.0, math.sqrt(2.0 / fan_in), (cout, cin // group, *kernel))
        b = self.rng.normal(0.0, 0.05, cout)
        kind = "depthwise_conv2d" if depthwise else "conv2d"
        name = f"{kind}_{self.counts.get(kind, 0)}"
        inputs = [x, self._const(f"{name}_kernel", w), self._const(f"{name}_bias", b)]
        y = _conv_np(v, w.astype(np.float32), b.astype(np.float32), stride, pads, group)
        return self._emit(kind, "Conv", inputs, y, kernel_shape=list(kernel),
                          strides=[stride, stride], pads=list(pads), group=group,
                          dilations=[1, 1])

    def bn(self, x: str) -> str:
        """Keras ``BatchNormalization`` in inference mode, statistics from calibration data."""
        v = self.values[x]
        axes = (0,) + tuple(range(2, v.ndim))
        mean, var = v.mean(axis=axes, dtype=np.float64), v.var(axis=axes, dtype=np.float64)
        c = v.shape[1]
        mean = mean + self.rng.normal(0.0, 0.1, c) * np.sqrt(var)
        var = var * self.rng.uniform(0.7, 1.4, c) + 1e-4
        gamma, beta = self.rng.uniform(0.6, 1.4, c), self.rng.normal(0.0, 0.2, c)
        name = f"batch_normalization_{self.counts.get('batch_normalization', 0)}"
        params = {"gamma": gamma, "beta": beta, "moving_mean": mean, "moving_variance": var}
        inputs = [x] + [self._const(f"{name}_{k}", p) for k, p in params.items()]
        p32 = [np.asarray(p, np.float32).reshape((1, c) + (1,) * (v.ndim - 2))
               for p in (gamma, beta, mean, var)]
        y = (v - p32[2]) / np.sqrt(p32[3] + np.float32(_BN_EPSILON)) * p32[0] + p32[1]
        return self._emit("batch_normalization", "BatchNormalization", inputs, y,
                          epsilon=_BN_EPSILON)

    def relu(self, x: str) -> str:
        return self._emit("activation", "Relu", [x], np.maximum(self.values[x], 0))

    def add(self, a: str, b: str) -> str:
        return self._emit("add", "Add", [a, b], self.values[a] + self.values[b])

    def avgpool(self, x: str, kernel: "tuple[int, int]") -> str:
        """Keras ``AveragePooling2D(pool_size=kernel)``: stride = kernel, 'valid' padding."""
        win = sliding_window_view(self.values[x], kernel, axis=(2, 3))
        y = win[:, :, ::kernel[0], ::kernel[1]].mean(axis=(-2, -1))
        return self._emit("average_pooling2d", "AveragePool", [x], y, kernel_shape=list(kernel),
                          strides=list(kernel), pads=[0, 0, 0, 0])

    def maxpool(self, x: str, kernel: int, stride: int, pad: int) -> str:
        """``MaxPool`` with symmetric padding ``pad`` (PyTorch ``nn.MaxPool2d``)."""
        v = np.pad(self.values[x], ((0, 0), (0, 0), (pad, pad), (pad, pad)),
                   constant_values=-np.inf)
        y = sliding_window_view(v, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
        return self._emit("max_pooling2d", "MaxPool", [x], y.max(axis=(-2, -1)),
                          kernel_shape=[kernel, kernel], strides=[stride, stride],
                          pads=[pad] * 4)

    def concat(self, xs: "list[str]") -> str:
        """``Concat`` along the channels."""
        return self._emit("concatenate", "Concat", list(xs),
                          np.concatenate([self.values[x] for x in xs], axis=1), axis=1)

    def leaky_relu(self, x: str, alpha: float = 0.1) -> str:
        v = self.values[x]
        return self._emit("leaky_relu", "LeakyRelu", [x], np.where(v >= 0, v, v * alpha),
                          alpha=alpha)

    def flatten(self, x: str) -> str:
        v = self.values[x]
        return self._emit("flatten", "Flatten", [x], v.reshape(v.shape[0], -1), axis=1)

    def dense(self, x: str, n: int) -> str:
        """Keras ``Dense`` as ``Gemm`` (``B`` = kernel [K, N], ``C`` = bias [N])."""
        v = self.values[x]
        w = self.rng.normal(0.0, math.sqrt(2.0 / v.shape[1]), (v.shape[1], n))
        b = self.rng.normal(0.0, 0.05, n)
        name = f"dense_{self.counts.get('dense', 0)}"
        inputs = [x, self._const(f"{name}_kernel", w), self._const(f"{name}_bias", b)]
        y = v @ w.astype(np.float32) + b.astype(np.float32)
        return self._emit("dense", "Gemm", inputs, y)

    def softmax(self, x: str) -> str:
        v = self.values[x]
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        return self._emit("softmax", "Softmax", [x], e / e.sum(axis=-1, keepdims=True), axis=-1)

    def model(self, out: str) -> onnx.ModelProto:
        assert self.nodes[-1].output[0] == out, "the graph output must be the last node's"
        self.nodes[-1].output[0] = "output"             # node names stay Keras-like
        out_shape = (1,) + self.values[out].shape[1:]
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, self.input_shape)],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
            self.inits, doc_string=self.doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)],
                                  ir_version=_IR_VERSION, producer_name="hwonnx.zoo",
                                  doc_string=self.doc)
        return model


def _same_pads(size, kernel, stride) -> "tuple[int, int, int, int]":
    """ONNX pads [top, left, bottom, right] of TensorFlow ``padding='same'``."""
    begin, end = [], []
    for n, k in zip(size, kernel):
        total = max((math.ceil(n / stride) - 1) * stride + k - n, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return (*begin, *end)


def _conv_np(x, w, b, stride, pads, group) -> np.ndarray:
    """NCHW grouped convolution (float32) of ``x`` [S, C, H, W] with ``w`` [O, C/g, KH, KW]."""
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    s, c, oh, ow, kh, kw = win.shape
    win = win.reshape(s, group, c // group, oh, ow, kh, kw)
    wg = w.reshape(group, -1, c // group, kh, kw)
    y = np.einsum("sgchwij,gocij->sgohw", win, wg, optimize=True).reshape(s, -1, oh, ow)
    return y + b.reshape(1, -1, 1, 1)


def conv_bn_relu(net: Net, x: str, cout: int, kernel=(3, 3), stride=1,
                 depthwise=False) -> str:
    """Append a convolution (``depthwise``: one filter per input channel), its batch norm and
    a ReLU to ``net``; returns the ReLU's output."""
    return net.relu(net.bn(net.conv(x, cout, kernel, stride, depthwise)))


def resnet8(seed: int = 0) -> onnx.ModelProto:
    """Image classification (CIFAR-10): ResNet-8, input [1, 3, 32, 32], 10-way softmax.

    Follows ``resnet_v1_eembc()`` in benchmark/training/image_classification/keras_model.py
    (v1.0 version: 16/32/64 filters, three stacks; stacks 2 and 3 stride 2 with a 1x1
    stride-2 conv, without batch norm, on the shortcut; AveragePooling2D(8); Dense + softmax).
    """
    net = Net("ic_resnet8", seed, (1, 3, 32, 32),
              f"MLPerf Tiny IC ResNet-8; {_REPO}benchmark/training/image_classification/"
              "keras_model.py")
    x = conv_bn_relu(net, "input", 16)
    for filters, stride in ((16, 1), (32, 2), (64, 2)):
        y = conv_bn_relu(net, x, filters, stride=stride)
        y = net.bn(net.conv(y, filters, (3, 3)))
        if stride != 1:
            x = net.conv(x, filters, (1, 1), stride)
        x = net.relu(net.add(x, y))
    x = net.flatten(net.avgpool(x, (8, 8)))
    return net.model(net.softmax(net.dense(x, 10)))


def ds_cnn(seed: int = 0) -> onnx.ModelProto:
    """Keyword spotting: DS-CNN (small), MFCC input [1, 1, 49, 10], 12-way softmax.

    Follows the ``ds_cnn`` branch of ``get_model()`` in
    benchmark/training/keyword_spotting/keras_model.py: Conv2D(64, (10, 4), strides 2,
    'same') + BN + ReLU, four depthwise-separable blocks (3x3 depthwise + BN + ReLU, 1x1
    conv 64 + BN + ReLU), AveragePooling2D((24, 5)) (= (int(49/2), int(10/2))), Dense(12) +
    softmax. Its two Dropout layers are identities at inference and are omitted.
    """
    net = Net("kws_dscnn", seed, (1, 1, 49, 10),
              f"MLPerf Tiny KWS DS-CNN; {_REPO}benchmark/training/keyword_spotting/"
              "keras_model.py")
    x = conv_bn_relu(net, "input", 64, (10, 4), stride=2)
    for _ in range(4):
        x = conv_bn_relu(net, x, 64, depthwise=True)
        x = conv_bn_relu(net, x, 64, (1, 1))
    x = net.flatten(net.avgpool(x, (49 // 2, 10 // 2)))
    return net.model(net.softmax(net.dense(x, 12)))


def mobilenet_v1_025(seed: int = 0) -> onnx.ModelProto:
    """Visual wake words: MobileNetV1 alpha 0.25, input [1, 3, 96, 96], 2-way softmax.

    Follows ``mobilenet_v1()`` in benchmark/training/visual_wake_words/vww_model.py: Conv2D(8,
    3x3, stride 2, 'same') + BN + ReLU, then 13 depthwise-separable blocks (3x3 depthwise
    + BN + ReLU, 1x1 conv + BN + ReLU; pointwise filters 16, 32, 32, 64, 64, 128 x6, 256,
    256; depthwise strides 2 in blocks 2, 4, 6, 12), AveragePooling2D(3x3), Dense(2) + softmax.
    """
    net = Net("vww_mobilenet", seed, (1, 3, 96, 96),
              f"MLPerf Tiny VWW MobileNetV1-0.25; {_REPO}benchmark/training/visual_wake_words/"
              "vww_model.py")
    x = conv_bn_relu(net, "input", 8, stride=2)
    blocks = [(16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2)] + [(128, 1)] * 5 \
        + [(256, 2), (256, 1)]
    for filters, stride in blocks:
        x = conv_bn_relu(net, x, 0, stride=stride, depthwise=True)
        x = conv_bn_relu(net, x, filters, (1, 1))
    size = net.values[x].shape[2:]
    x = net.flatten(net.avgpool(x, size))
    return net.model(net.softmax(net.dense(x, 2)))


def autoencoder(seed: int = 0) -> onnx.ModelProto:
    """Anomaly detection (ToyADMOS): dense autoencoder, input [1, 640] (5 frames x 128 mels).

    Follows ``get_model(640)`` in benchmark/training/anomaly_detection/keras_model.py:
    Dense 128, 128, 128, 128, 8, 128, 128, 128, 128, each + BN + ReLU, then Dense(640)
    (linear reconstruction, no softmax).
    """
    net = Net("ad_autoencoder", seed, (1, 640),
              f"MLPerf Tiny AD autoencoder; {_REPO}benchmark/training/anomaly_detection/"
              "keras_model.py")
    x = "input"
    for units in (128, 128, 128, 128, 8, 128, 128, 128, 128):
        x = net.relu(net.bn(net.dense(x, units)))
    return net.model(net.dense(x, 640))


#: Benchmark name -> builder ``(seed: int = 0) -> onnx.ModelProto``.
MLPERF_TINY = {
    "ic_resnet8": resnet8,
    "kws_dscnn": ds_cnn,
    "vww_mobilenet": mobilenet_v1_025,
    "ad_autoencoder": autoencoder,
}


def count_macs(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of the model's Conv, Gemm and MatMul nodes (main graph).

    Shapes come from ``onnx.shape_inference``. A Conv costs (output elements) x (Cin/group)
    x KH x KW, a Gemm M x K x N, a MatMul (output elements) x K; other ops (batch norm,
    pooling, activations, adds) count zero. Raises ValueError if a shape is unknown.
    """
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    shapes = {t.name: tuple(t.dims) for t in g.initializer}
    for info in (*g.input, *g.value_info, *g.output):
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = tuple(d.dim_value for d in dims)

    def shape(name: str, node: onnx.NodeProto) -> "tuple[int, ...]":
        if name not in shapes:
            raise ValueError(f"{node.op_type} '{node.name}': shape of '{name}' is unknown")
        return shapes[name]

    total = 0
    for node in g.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        out = math.prod(shape(node.output[0], node))
        if node.op_type == "Conv":
            reduce = math.prod(shape(node.input[1], node)[1:])
        elif node.op_type == "Gemm":
            trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
            reduce = shape(node.input[0], node)[0 if trans_a else 1]
        else:
            reduce = shape(node.input[0], node)[-1]
        total += out * reduce
    return int(total)


def _plausible(shape: "tuple[int, ...]", samples: int, rng: np.random.Generator) -> np.ndarray:
    """``samples`` inputs of ``shape`` (batch axis included) that look like the task's data.

    [1, 3, H, W]: images in [0, 1], smooth colour blobs plus pixel noise. [1, 1, T, F]: MFCC
    features, correlated in time, larger low-order coefficients. [1, N]: log-mel frames in dB
    (N/128 frames of 128 bands, spectrum falling with frequency). Otherwise standard normal.
    """
    body = shape[1:]
    if len(body) == 3 and body[0] == 3:
        _, h, w = body
        lum = rng.uniform(0, 1, (samples, 1, 6, 6))
        low = 0.6 * lum + 0.4 * rng.uniform(0, 1, (samples, 3, 6, 6))
        up = low.repeat(-(-h // 6), axis=2).repeat(-(-w // 6), axis=3)[:, :, :h, :w]
        kernel = np.ones(5) / 5                                # soften the block edges
        for axis in (2, 3):
            up = np.apply_along_axis(np.convolve, axis, up, kernel, mode="same")
        x = np.clip(up + rng.normal(0, 0.04, up.shape), 0, 1)
    elif len(body) == 3 and body[0] == 1:
        _, t, f = body
        scale = 12.0 / (1.0 + np.arange(f))                    # MFCC energy falls with order
        x = np.empty((samples, 1, t, f))
        x[:, :, 0] = rng.normal(0, 1, (samples, 1, f)) * scale
        for i in range(1, t):
            x[:, :, i] = 0.8 * x[:, :, i - 1] + rng.normal(0, 0.6, (samples, 1, f)) * scale
        x[:, :, :, 0] -= 30.0                                  # log-energy term
    elif len(body) == 1:
        n = body[0]
        bands = 128 if n % 128 == 0 else n
        tilt = np.linspace(-10.0, -45.0, bands)                # dB, falling with frequency
        level = rng.normal(0, 6, (samples, 1, 1))
        colour = rng.normal(0, 4, (samples, 1, bands))
        frames = tilt + level + colour + rng.normal(0, 2, (samples, n // bands, bands))
        x = frames.reshape(samples, n)
    else:
        x = rng.standard_normal((samples,) + body)
    return x.reshape((samples,) + tuple(shape)).astype(np.float32)


def random_inputs(model: onnx.ModelProto, samples: int = 16, seed: int = 0
                  ) -> "dict[str, np.ndarray]":
    """Plausible calibration / test data: ``{input name: float32 [samples, *input shape]}``
    (``[samples, *input shape[1:]]`` for a model with a fixed batch other than 1: the samples
    replace its batch, as hwonnx streams them).

    The data kind follows the input shape (see :func:`_plausible`): images in [0, 1], MFCC
    features, or log-mel frames in dB; the format is the one hwonnx's ``calib`` accepts.
    """
    initializers = {t.name for t in model.graph.initializer}
    result = {}
    for index, info in enumerate(i for i in model.graph.input if i.name not in initializers):
        dims = tuple(d.dim_value if d.HasField("dim_value") else 1
                     for d in info.type.tensor_type.shape.dim)
        data = _plausible((1,) + dims[1:], samples, np.random.default_rng([seed, 2, index]))
        # a model with a fixed batch N > 1 takes the samples along its batch axis
        result[info.name] = data if dims[:1] == (1,) else data[:, 0]
    return result
