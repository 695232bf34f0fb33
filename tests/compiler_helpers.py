"""Small integer graphs and architectures the compiler's tests share: a
Quantize -> QConv -> Flatten -> QDense -> Dequantize chain with random int8 constants, and
four array shapes (square, the default, two with a small accumulator). And the ONNX models of
the external-memory tests in tests/compiler/: the model whose weights stream
(test_external_weights.py, test_paged_program.py; also tests/cli/test_report_plot.py) and the
model whose activations spill (test_spilled_activations.py, test_replay.py; also
tests/cli/test_cli_ext_memory.py)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hwonnx.compiler import Op
from hwonnx.config import ArchConfig
from hwonnx.ir import Graph, Node, TensorType

from rtl_helpers import he_weight

__all__ = ["ceil_div", "conv_out", "chain", "CONFIGS", "streamed_model", "streamed_samples",
           "check_fences", "SPILLED_H", "SPILLED_W", "spilled_config", "onnx_model",
           "spilled_model", "spilled_samples"]


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


# The model whose weights stream from the external memory (test_external_weights.py) --------

def streamed_model() -> onnx.ModelProto:
    """x [1, 8, 6, 6] -> Conv 3x3 8->64 + Relu -> Conv 1x1 64->64 + Relu (twice) -> global
    average pool -> Gemm 64->10."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(he_weight(rng, 64, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 64, 64, 1, 1), "w1"),
             numpy_helper.from_array(he_weight(rng, 64, 64, 1, 1), "w2"),
             numpy_helper.from_array(he_weight(rng, 10, 64), "wf"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "bf")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(
        nodes, "streamed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def streamed_samples(count: int) -> "dict[str, np.ndarray]":
    """``count`` random samples of :func:`streamed_model`'s input."""
    return {"x": np.random.default_rng(1).random((count, 8, 6, 6)).astype(np.float32)
            .reshape(count, 1, 8, 6, 6)[:, 0]}


def check_fences(program) -> None:
    """Every LOADW that reads words a LOADX wrote, and every POST that reads parameter words
    a LOADX wrote, comes after a later LOADX (accepted only once the DMA is idle): the RTL
    may not show a missing fence when the copy happens to finish early, so the program is
    checked on its own."""
    copies = {"wgt": [], "par": []}          # [first word, end, fenced]
    for instr in program.expanded():
        if instr.op == Op.LOADX:
            for copy in copies["wgt"] + copies["par"]:
                copy[2] = True
            copies["wgt"].append([instr["wgt_addr"], instr["wgt_addr"] + instr["count"], False])
            words = instr.get("par_count", 0) // 9
            copies["par"].append([instr.get("par_addr", 0), instr.get("par_addr", 0) + words,
                                  False])
        elif instr.op in (Op.LOADW, Op.POST):
            buffer = "wgt" if instr.op == Op.LOADW else "par"
            address = instr[f"{buffer}_addr"]
            writers = [c for c in copies[buffer] if c[0] <= address < c[1]]
            assert not writers or writers[-1][2], f"{buffer} word {address} read unfenced"


# The model whose activations spill to the external memory (test_spilled_activations.py) ----

SPILLED_H, SPILLED_W = 20, 16


def spilled_config(act_depth: int = 400, stage: int = 256, **changes) -> ArchConfig:
    """The architecture with ``stage`` words in each staging buffer."""
    fields = dict(act_depth=act_depth, wgt_depth=4096, acc_depth=256, par_depth=64,
                  prog_depth=512, ext_memory="ulx3s-sdram", ext_depth=1 << 14,
                  stage_in_depth=stage, stage_out_depth=stage)
    return ArchConfig(**{**fields, **changes})


def onnx_model(nodes, name: str, x_shape: list, y_shape: list, inits) -> onnx.ModelProto:
    """The model of ``nodes`` from float input ``x`` to float output ``y``."""
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def spilled_model() -> onnx.ModelProto:
    """x [1, 8, 20, 16] -> Conv 3x3 8->16 + Relu -> MaxPool 3x3 stride 2 pad 1 -> Conv 3x3 +
    Relu -> Conv 3x3 -> Add (the pool's output) + Relu -> depthwise Conv 3x3 stride 2 + Relu ->
    global average pool -> Gemm 16->10."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(he_weight(rng, 16, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 16, 16, 3, 3), "w1"),
             numpy_helper.from_array(he_weight(rng, 16, 16, 3, 3), "w2"),
             numpy_helper.from_array(he_weight(rng, 16, 1, 3, 3), "wd"),
             numpy_helper.from_array(he_weight(rng, 10, 16), "wf"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "bf")]
    same = dict(pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", **same),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["m0"], kernel_shape=[3, 3], strides=[2, 2],
                              name="pool0", **same),
             helper.make_node("Conv", ["m0", "w1"], ["c1"], name="conv1", **same),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", **same),
             helper.make_node("Add", ["c2", "m0"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Conv", ["ra", "wd"], ["d"], strides=[2, 2], group=16,
                              name="dw", **same),
             helper.make_node("Relu", ["d"], ["rd"]),
             helper.make_node("GlobalAveragePool", ["rd"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    return onnx_model(nodes, "spilled", [1, 8, SPILLED_H, SPILLED_W], [1, 10], inits)


def spilled_samples(count: int) -> "dict[str, np.ndarray]":
    """``count`` random samples of :func:`spilled_model`'s input."""
    return {"x": np.random.default_rng(1).random((count, 8, SPILLED_H, SPILLED_W))
            .astype(np.float32)}
