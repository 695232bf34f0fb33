"""ImageNet-class architectures as ONNX graphs with seeded random weights, laid out as
:mod:`.mlperf_tiny`'s are (``Conv`` + ``BatchNormalization`` + activation, explicit 'same'
pads, batch-norm statistics measured on plausible inputs): models larger than any FPGA's
block RAM, for the external memory (``docs/architecture.md``, "External memory").

- :func:`resnet18`: ResNet-18 (He et al. 2016), [1, 3, 224, 224] -> 1000 classes, 11.7 M
  parameters, 1.8 G multiply-accumulates.
- :func:`mobilenet_v2`: MobileNetV2 1.0 (Sandler et al. 2018), [1, 3, 224, 224] -> 1000
  classes, 3.5 M parameters, 0.3 G multiply-accumulates.
- :func:`yolo_tiny`: a YOLO-style detector after YOLOv2-tiny's backbone (3x3 conv + batch
  norm + LeakyReLU 0.1, max pooling), [1, 3, 256, 256] -> an 8x8 grid of 3 anchors x (5 + 20
  classes).
- :func:`unet_tiny`: a four-level U-Net (Ronneberger et al. 2015) at [1, 3, 256, 256] -> 2
  classes per pixel, upsampling by 2x2 transposed convolutions, skips by channel Concat.

Batch-norm statistics come from :data:`SAMPLES` samples (the MLPerf Tiny builders use 32;
these graphs are 100 times larger)."""

from __future__ import annotations

import numpy as np
import onnx

from .mlperf_tiny import Net, conv_bn_relu

__all__ = ["IMAGENET", "resnet18", "mobilenet_v2", "yolo_tiny", "unet_tiny"]

#: Calibration samples the builders evaluate to set batch-norm statistics.
SAMPLES = 4


def resnet18(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18: 7x7/2 conv 64, 3x3/2 max pool, four stages of two basic blocks (64, 128,
    256, 512 channels; stages 2-4 start with stride 2 and a 1x1/2 conv + batch norm on the
    shortcut), global average pool, fully connected 1000."""
    net = Net("resnet18", seed, (1, 3, 224, 224), "ResNet-18 (He et al. 2016), seeded",
              SAMPLES)
    x = conv_bn_relu(net, "input", 64, (7, 7), stride=2)
    x = net.maxpool(x, 3, 2, 1)
    for filters, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = conv_bn_relu(net, x, filters, stride=s)
            y = net.bn(net.conv(y, filters, (3, 3)))
            if s != 1 or net.values[x].shape[1] != filters:
                x = net.bn(net.conv(x, filters, (1, 1), s))
            x = net.relu(net.add(x, y))
    x = net.flatten(net.avgpool(x, net.values[x].shape[2:]))
    return net.model(net.dense(x, 1000))


def mobilenet_v2(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 1.0: 3x3/2 conv 32, 17 inverted residual blocks (1x1 expansion by t, 3x3
    depthwise, 1x1 linear projection; a residual Add where the shape is kept), 1x1 conv 1280,
    global average pool, fully connected 1000. ReLU6 is written as ReLU (a Clip of 0..6
    after int8 requantization differs only in the calibrated range)."""
    net = Net("mobilenet_v2", seed, (1, 3, 224, 224), "MobileNetV2 1.0 (Sandler et al. "
              "2018), seeded", SAMPLES)
    x = conv_bn_relu(net, "input", 32, stride=2)
    settings = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))
    for t, channels, repeat, stride in settings:
        for block in range(repeat):
            s = stride if block == 0 else 1
            cin = net.values[x].shape[1]
            y = conv_bn_relu(net, x, cin * t, (1, 1)) if t != 1 else x
            y = conv_bn_relu(net, y, 0, stride=s, depthwise=True)
            y = net.bn(net.conv(y, channels, (1, 1)))
            x = net.add(x, y) if s == 1 and cin == channels else y
    x = conv_bn_relu(net, x, 1280, (1, 1))
    x = net.flatten(net.avgpool(x, net.values[x].shape[2:]))
    return net.model(net.dense(x, 1000))


def yolo_tiny(seed: int = 0) -> onnx.ModelProto:
    """A YOLO-style detector: five 3x3 conv + batch norm + LeakyReLU(0.1) stages of 16 to 256
    channels, each followed by a 2x2/2 max pool (256 -> 8), a 3x3 conv 512, and a 1x1
    detection head of 3 x (5 + 20) = 75 channels on the 8x8 grid (no activation: the decoder
    of boxes runs on the host)."""
    net = Net("yolo_tiny", seed, (1, 3, 256, 256), "YOLO-style detector after YOLOv2-tiny, "
              "seeded", SAMPLES)
    x = "input"
    for filters in (16, 32, 64, 128, 256):
        x = net.leaky_relu(net.bn(net.conv(x, filters, (3, 3))))
        x = net.maxpool(x, 2, 2, 0)
    x = net.leaky_relu(net.bn(net.conv(x, 512, (3, 3))))
    return net.model(net.conv(x, 75, (1, 1)))


def unet_tiny(seed: int = 0) -> onnx.ModelProto:
    """A four-level U-Net: two 3x3 conv + batch norm + ReLU per level (16, 32, 64, 128
    channels, 2x2/2 max pooling down), 256 at the bottom, 2x2/2 transposed convolutions up,
    each concatenated with the level's skip, and a 1x1 conv to 2 classes per pixel."""
    net = Net("unet_tiny", seed, (1, 3, 256, 256), "U-Net (Ronneberger et al. 2015), four "
              "levels, seeded", SAMPLES)

    def double(x: str, filters: int) -> str:
        return conv_bn_relu(net, conv_bn_relu(net, x, filters), filters)

    skips, x = [], "input"
    for filters in (16, 32, 64, 128):
        x = double(x, filters)
        skips.append(x)
        x = net.maxpool(x, 2, 2, 0)
    x = double(x, 256)
    for filters, skip in zip((128, 64, 32, 16), reversed(skips)):
        x = net.concat([_up(net, x, filters), skip])
        x = double(x, filters)
    return net.model(net.conv(x, 2, (1, 1)))


def _up(net: Net, x: str, filters: int) -> str:
    """A 2x2 stride-2 ``ConvTranspose`` with a bias (Keras ``Conv2DTranspose``)."""
    v = net.values[x]
    cin = v.shape[1]
    w = net.rng.normal(0.0, np.sqrt(2.0 / cin), (cin, filters, 2, 2))
    b = net.rng.normal(0.0, 0.05, filters)
    name = f"conv2d_transpose_{net.counts.get('conv2d_transpose', 0)}"
    inputs = [x, net._const(f"{name}_kernel", w), net._const(f"{name}_bias", b)]
    y = np.einsum("schw,coij->sohiwj", v, w.astype(np.float32))
    s, o, h, _, wd, _ = y.shape
    y = y.reshape(s, o, 2 * h, 2 * wd) + b.reshape(1, -1, 1, 1)
    return net._emit("conv2d_transpose", "ConvTranspose", inputs, y, kernel_shape=[2, 2],
                     strides=[2, 2])


#: Name -> builder ``(seed: int = 0) -> onnx.ModelProto``.
IMAGENET = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "yolo_tiny": yolo_tiny,
            "unet_tiny": unet_tiny}
