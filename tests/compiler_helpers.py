"""Small integer graphs and architectures the compiler's tests share: a
Quantize -> QConv -> Flatten -> QDense -> Dequantize chain with random int8 constants, and
four array shapes (square, the default, two with a small accumulator)."""

import numpy as np

from hwonnx.config import ArchConfig
from hwonnx.ir import Graph, Node, TensorType

__all__ = ["ceil_div", "conv_out", "chain", "CONFIGS"]


def ceil_div(a, b):
    return -(-a // b)


def conv_out(size, kernel, stride, begin, end, dilation=1):
    return (size + begin + end - dilation * (kernel - 1) - 1) // stride + 1


def chain(c=5, h=6, w=7, m=10, n=9, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
          seed=0):
    """Quantize -> QConv -> Flatten -> QDense -> Dequantize with random int8 constants."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel
    oh = conv_out(h, kh, strides[0], pads[0], pads[2])
    ow = conv_out(w, kw, strides[1], pads[1], pads[3])
    k = m * oh * ow

    def layer(prefix, w_shape, channels, shift):
        return {f"{prefix}.w": rng.integers(-127, 128, w_shape).astype(np.int8),
                f"{prefix}.b": rng.integers(-2000, 2000, channels).astype(np.int32),
                f"{prefix}.m": rng.integers(1 << 30, 1 << 31, channels).astype(np.int32),
                f"{prefix}.s": np.full(channels, shift, np.int32)}

    constants = {**layer("conv", (m, c, kh, kw), m, 39), **layer("fc", (k, n), n, 42)}
    types = {"x": TensorType("float32", (1, c, h, w)), "xq": TensorType("int8", (1, c, h, w)),
             "yq": TensorType("int8", (1, m, oh, ow)), "fq": TensorType("int8", (1, k)),
             "dq": TensorType("int8", (1, n)), "out": TensorType("float32", (1, n))}
    types.update({name: TensorType(str(v.dtype), v.shape) for name, v in constants.items()})
    nodes = [
        Node("quantize", "Quantize", ("x",), ("xq",), {"scale": 0.05, "zero_point": -3}),
        Node("conv", "QConv", ("xq", "conv.w", "conv.b", "conv.m", "conv.s"), ("yq",),
             {"in_zp": -3, "out_zp": -128, "lo": -128, "hi": 127, "strides": strides,
              "pads": pads, "dilations": (1, 1)}),
        Node("flatten", "Flatten", ("yq",), ("fq",), {"axis": 1}),
        Node("fc", "QDense", ("fq", "fc.w", "fc.b", "fc.m", "fc.s"), ("dq",),
             {"in_zp": -128, "out_zp": 4, "lo": -128, "hi": 127}),
        Node("dequantize", "Dequantize", ("dq",), ("out",), {"scale": 0.1, "zero_point": 4}),
    ]
    graph = Graph(nodes, ("x",), ("out",), types, constants)
    graph.verify()
    return graph


CONFIGS = [ArchConfig(rows=4, cols=4), ArchConfig(), ArchConfig(rows=3, cols=5, acc_depth=16),
           ArchConfig(rows=8, cols=2, acc_depth=12)]
