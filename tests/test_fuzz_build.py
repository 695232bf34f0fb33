"""Structure-aware fuzzing of the loader and the build: Hypothesis draws lists of mutations
of the ONNX protobuf fields of small buildable seed models (dims of inputs, outputs,
value_info and initializers; attributes, their names, values and types; element types;
node inputs, outputs, op types, domains and order; initializer data and its storage fields;
opset and IR versions; graph inputs and outputs), and each mutated model goes through
``load_model``, the float evaluator and ``api.build(..., verilog=False)``.

Every outcome must be a clean hwonnx error (``HwonnxError``) or a correct result: a loaded
graph evaluates on a random input with the output shapes it declares, and a build is a
program that encodes and whose golden output on a random input is finite. Anything else is
a failure: another exception (a crash), a memory blow-up (a ``MemoryError`` under the cap:
the address space may grow by at most ``MEMORY_HEADROOM`` during the test; or a case that
raises the process's peak memory by more than 1 GiB), a case that runs longer than
``PER_CASE_SECONDS`` (a hang), a warning (an error in the test suite), or a wrong result.

A test runs its cases without stopping at the first failure: it counts every outcome,
groups failures by class (exception type and the hwonnx line that raised it, or the check
that failed), keeps the smallest example of each class, lets Hypothesis shrink it to the
fewest mutations that still fail the same way, and fails at the end listing every class
with its count, message and a reproducer (``KNOWN_FAILURES`` can mark classes as expected).

Tiers: ``test_fuzz_build_smoke`` (default, 300 cases, about 15 s) and ``test_fuzz_build``
(``-m slow``, 32 seed blocks of 2,000 cases, spread by pytest-xdist). Cases are seeded
(``hypothesis.seed`` per block, no example database), so every run draws the same ones. With
``HWONNX_RELIABILITY_LOG=<file>`` each test appends a JSON line of its counts."""

import contextlib
import faulthandler
import json
import os
import resource
import signal
import traceback
import warnings
import zlib
from collections import Counter
from pathlib import Path
from random import Random

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample, Unsatisfiable
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from hwonnx.api import build, run_golden
from hwonnx.compiler.program import encode_program
from hwonnx.errors import HwonnxError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float

PER_CASE_SECONDS = 10
MEMORY_HEADROOM = 4 << 30           # the address space may grow by this much during a test
MAX_FEED_ELEMENTS = 1 << 18         # larger inputs are not evaluated (build without calib)
SMOKE = (300, 1)                    # (cases per block, blocks)
SLOW = (2000, 32)
HWONNX = str(Path(__import__("hwonnx").__file__).resolve().parent)


# Seed models: small, valid and buildable, covering the operators and host steps ----------

def _w(rng, *shape, s=0.3):
    return rng.normal(0, s, shape).astype(np.float32)


def _model(nodes, inits, inputs, outputs, opset=13, **kw):
    graph = helper.make_graph(
        nodes, "seed",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8,
                             opset_imports=[helper.make_opsetid("", opset)], **kw)


def seed_cnn() -> onnx.ModelProto:
    """Pad -> Conv -> Relu -> MaxPool -> Conv (dilated) -> BatchNorm -> Relu -> AveragePool
    -> GlobalAveragePool -> Flatten -> Gemm -> Softmax (host)."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Pad", ["x", "pads", "pad_value"], ["p"], name="pad", mode="constant"),
             n("Conv", ["p", "c1_w", "c1_b"], ["c1"], name="conv1"),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("MaxPool", ["r1"], ["m1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["m1", "c2_w"], ["c2"], name="conv2", pads=[2, 2, 2, 2],
               dilations=[2, 2]),
             n("BatchNormalization", ["c2", "bn_s", "bn_b", "bn_m", "bn_v"], ["b2"],
               name="bn", epsilon=1e-5),
             n("Relu", ["b2"], ["r2"], name="relu2"),
             n("AveragePool", ["r2"], ["a2"], name="avg", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               count_include_pad=0),
             n("GlobalAveragePool", ["a2"], ["g"], name="gap"),
             n("Flatten", ["g"], ["f"], name="flatten"),
             n("Gemm", ["f", "fc_w", "fc_b"], ["z"], name="fc", transB=1),
             n("Softmax", ["z"], ["y"], name="softmax", axis=1)]
    inits = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "pad_value": np.array(0.5, np.float32),
             "c1_w": _w(rng, 6, 3, 3, 3), "c1_b": _w(rng, 6, s=0.1), "c2_w": _w(rng, 8, 6, 3, 3),
             "bn_s": rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_b": _w(rng, 8, s=0.1),
             "bn_m": _w(rng, 8, s=0.1), "bn_v": rng.uniform(0.5, 2, 8).astype(np.float32),
             "fc_w": _w(rng, 10, 8), "fc_b": _w(rng, 10, s=0.1)}
    return _model(nodes, inits, {"x": [1, 3, 8, 8]}, {"y": (TensorProto.FLOAT, [1, 10])})


def seed_mlp() -> onnx.ModelProto:
    """Sub, Div (host) -> MatMul + Add -> Relu -> Gemm -> Clip -> Gemm -> LeakyRelu -> Gemm
    -> ArgMax (host)."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("Sub", ["x", "mean"], ["s"], name="sub"), n("Div", ["s", "std"], ["d"], name="div"),
             n("MatMul", ["d", "w1"], ["m1"], name="mm1"), n("Add", ["m1", "b1"], ["a1"],
                                                              name="bias1"),
             n("Relu", ["a1"], ["r1"], name="relu1"),
             n("Gemm", ["r1", "w2", "b2"], ["g2"], name="fc2", alpha=1.0, beta=1.0),
             n("Clip", ["g2", "lo", "hi"], ["c2"], name="clip"),
             n("Gemm", ["c2", "w3"], ["g3"], name="fc3"),
             n("LeakyRelu", ["g3"], ["l3"], name="leaky", alpha=0.1),
             n("Gemm", ["l3", "w4", "b4"], ["z"], name="fc4", transB=1),
             n("ArgMax", ["z"], ["y"], name="argmax", axis=1, keepdims=1)]
    inits = {"mean": np.full(16, 0.1, np.float32), "std": np.full(16, 2.0, np.float32),
             "w1": _w(rng, 16, 12), "b1": _w(rng, 12, s=0.1), "w2": _w(rng, 12, 12),
             "b2": _w(rng, 12, s=0.1), "lo": np.array(0, np.float32),
             "hi": np.array(6, np.float32), "w3": _w(rng, 12, 8), "w4": _w(rng, 5, 8),
             "b4": _w(rng, 5, s=0.1)}
    return _model(nodes, inits, {"x": [1, 16]}, {"y": (TensorProto.INT64, [1, 1])})


def seed_residual() -> onnx.ModelProto:
    """Transpose (NHWC input, host) -> Conv 1x1 -> Relu -> depthwise Conv -> Sigmoid -> Add
    (residual) -> Concat -> grouped Conv -> HardSwish -> MaxPool (dilated, padded) -> Mul by
    a per-channel constant -> Tanh -> Reshape -> Gemm -> HardSigmoid."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], name="nhwc", perm=[0, 3, 1, 2]),
             n("Conv", ["t", "c1_w", "c1_b"], ["c1"], name="conv1"),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("Conv", ["r1", "dw_w", "dw_b"], ["dw"], name="dw", group=8, pads=[1, 1, 1, 1]),
             n("Sigmoid", ["dw"], ["sg"], name="sig"),
             n("Add", ["sg", "r1"], ["ad"], name="residual"),
             n("Concat", ["ad", "r1"], ["cat"], name="concat", axis=1),
             n("Conv", ["cat", "g_w"], ["gc"], name="grouped", group=4, strides=[1, 2]),
             n("HardSwish", ["gc"], ["hs"], name="hswish"),
             n("MaxPool", ["hs"], ["mp"], name="pool", kernel_shape=[2, 2], pads=[1, 0, 0, 1],
               dilations=[1, 2]),
             n("Mul", ["mp", "scale"], ["ml"], name="mul"),
             n("Tanh", ["ml"], ["th"], name="tanh"),
             n("Reshape", ["th", "shape"], ["rs"], name="reshape"),
             n("Gemm", ["rs", "fc_w", "fc_b"], ["z"], name="fc", transB=1),
             n("HardSigmoid", ["z"], ["y"], name="hsig", alpha=0.2, beta=0.5)]
    inits = {"c1_w": _w(rng, 8, 4, 1, 1), "c1_b": _w(rng, 8, s=0.1), "dw_w": _w(rng, 8, 1, 3, 3),
             "dw_b": _w(rng, 8, s=0.1), "g_w": _w(rng, 8, 4, 3, 3),
             "scale": rng.uniform(0.5, 2, (1, 8, 1, 1)).astype(np.float32),
             "shape": np.array([1, -1], np.int64), "fc_w": _w(rng, 6, 8 * 4 * 1),
             "fc_b": _w(rng, 6, s=0.1)}
    return _model(nodes, inits, {"x": [1, 6, 6, 4]}, {"y": (TensorProto.FLOAT, [1, 6])},
                  opset=14)


def seed_qdq() -> onnx.ModelProto:
    """A pre-quantized (QDQ) Conv -> Relu -> Flatten -> Gemm: int8 weights, an int32 bias,
    QuantizeLinear / DequantizeLinear around the activations."""
    rng = np.random.default_rng(4)
    n = helper.make_node

    def q(x, name):                        # QuantizeLinear then DequantizeLinear
        return [n("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"q_{name}"),
                n("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                  name=f"dq_{name}")]

    def dq(name):                          # DequantizeLinear of an int initializer
        return n("DequantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                 name=f"dq_{name}")

    nodes = [*q("x", "xq"), dq("cw"), dq("cb"),
             n("Conv", ["xq_dq", "cw_dq", "cb_dq"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["r"], name="relu"), *q("r", "rq"),
             n("Flatten", ["rq_dq"], ["f"], name="flatten"), dq("fw"),
             n("Gemm", ["f", "fw_dq"], ["z"], name="fc", transB=1), *q("z", "y")]
    scalar = {"xq": (0.02, 0, np.int8), "rq": (0.05, -128, np.int8), "y": (0.1, 3, np.int8),
              "cw": (0.01, 0, np.int8), "cb": (0.0002, 0, np.int32), "fw": (0.01, 0, np.int8)}
    inits = {"cw": rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8),
             "cb": rng.integers(-500, 500, 4).astype(np.int32),
             "fw": rng.integers(-127, 128, (5, 4 * 4 * 4)).astype(np.int8)}
    for name, (scale, zp, dtype) in scalar.items():
        inits[f"{name}_s"] = np.array(scale, np.float32)
        inits[f"{name}_z"] = np.array(zp, dtype)
    return _model(nodes, inits, {"x": [1, 2, 4, 4]}, {"y_dq": (TensorProto.FLOAT, [1, 5])})


SEEDS = {"cnn": seed_cnn, "mlp": seed_mlp, "residual": seed_residual, "qdq": seed_qdq}


# Mutations -------------------------------------------------------------------------------
#
# A mutation is a tuple of plain values (so that a failing example prints as a reproducer);
# indices are taken modulo the number of candidates, so one mutation applies to any model.

INTS = [0, 1, -1, 2, 3, 5, 7, 13, 64, 255, 256, 1 << 15, (1 << 31) - 1, 1 << 31, 1 << 40,
        1 << 62, -(1 << 62), (1 << 63) - 1, -(1 << 63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e-30, 1e30, 3.4e38, float("nan"), float("inf"),
          float("-inf")]
STRINGS = ["", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "constant", "reflect", "edge",
           "x", "y", "N", "bogus", "\u00e9"]
ATTRIBUTES = ["kernel_shape", "strides", "pads", "dilations", "group", "auto_pad", "ceil_mode",
              "count_include_pad", "storage_order", "axis", "alpha", "beta", "transA",
              "transB", "epsilon", "momentum", "perm", "keepdims", "select_last_index", "mode",
              "value", "min", "max", "to", "allowzero", "spatial", "training_mode", "k",
              "largest", "sorted", "saturate", "block_size", "value_float", "value_ints",
              "unknown"]
OPS = ["Conv", "Gemm", "MatMul", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool",
       "GlobalMaxPool", "Add", "Mul", "Sub", "Div", "Concat", "Flatten", "Reshape", "Pad",
       "Clip", "BatchNormalization", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid",
       "HardSwish", "Softmax", "LogSoftmax", "ArgMax", "TopK", "Transpose", "Cast",
       "Identity", "Dropout", "Squeeze", "Unsqueeze", "QuantizeLinear", "DequantizeLinear",
       "Constant", "Shape", "Gather", "If", "Loop", "Resize", "", "NoSuchOp"]
DTYPES = sorted(TensorProto.DataType.values()) + [99]
DOMAINS = ["", "ai.onnx", "com.microsoft", "ai.onnx.ml", "custom"]

ints = st.one_of(st.sampled_from(INTS), st.integers(-4, 16))
floats = st.one_of(st.sampled_from(FLOATS), st.floats(-10, 10, width=32))
index = st.integers(0, 63)
dim = st.one_of(ints, st.sampled_from(["N", "", "batch"]))
attribute_value = st.one_of(
    ints, floats, st.lists(ints, max_size=6), st.lists(floats, min_size=1, max_size=4),
    st.sampled_from(STRINGS), st.tuples(st.just("tensor"), st.lists(floats, max_size=4)),
    st.none())

MUTATIONS = st.one_of(
    # shapes of graph inputs, outputs and value_info: one dim, append (-1), drop (-2), no
    # shape (-3), or a run of equal dims
    st.tuples(st.just("shape"), st.sampled_from(["input", "output", "value_info"]), index,
              st.integers(-3, 5), dim),
    st.tuples(st.just("shape_run"), st.sampled_from(["input", "output"]), index,
              st.sampled_from([0, 5, 40, 300, 1000]), ints),
    # initializer dims, with data resized to fit (True) or left as it is (False)
    st.tuples(st.just("init_dims"), index, st.lists(ints, max_size=5), st.booleans()),
    # initializer values (in the tensor's own type), raw bytes, or its data in another field
    st.tuples(st.just("init_values"), index, st.lists(st.one_of(floats, ints), min_size=1,
                                                      max_size=4)),
    st.tuples(st.just("init_raw"), index, st.binary(max_size=48)),
    st.tuples(st.just("init_field"), index, st.sampled_from(
        ["float_data", "int32_data", "int64_data", "double_data", "uint64_data",
         "string_data", "external"])),
    st.tuples(st.just("dtype"), st.sampled_from(["input", "output", "init", "value_info"]),
              index, st.sampled_from(DTYPES)),
    st.tuples(st.just("attr"), index, st.sampled_from(ATTRIBUTES), attribute_value),
    st.tuples(st.just("attr_type"), index, index, st.sampled_from(
        sorted(AttributeProto.AttributeType.values()))),
    # node inputs and outputs: another value's name, "", a fresh name, dropped, appended
    st.tuples(st.just("io"), index, st.sampled_from(["input", "output"]), index,
              st.sampled_from(["other", "empty", "fresh", "drop", "append"]), index),
    st.tuples(st.just("op_type"), index, st.sampled_from(OPS)),
    st.tuples(st.just("domain"), index, st.sampled_from(DOMAINS)),
    st.tuples(st.just("node"), index, st.sampled_from(["delete", "duplicate", "first", "last",
                                                       "swap"])),
    st.tuples(st.just("opset"), st.sampled_from(["default", "ir", "extra"]),
              st.one_of(st.integers(-1, 26), st.sampled_from([1000, 1 << 40])),
              st.sampled_from(DOMAINS)),
    st.tuples(st.just("graph_io"), st.sampled_from(["drop_input", "drop_output",
                                                    "output_intermediate", "input_initializer",
                                                    "duplicate_output", "input_unused"]),
              index),
)

CASES = st.tuples(st.sampled_from(sorted(SEEDS)), st.lists(MUTATIONS, min_size=1, max_size=3))


def _pick(items, i):
    return items[i % len(items)] if len(items) else None


def _value_names(graph) -> "list[str]":
    names = [v.name for v in (*graph.input, *graph.initializer)]
    names += [o for node in graph.node for o in node.output]
    return names


def _tensor_types(graph, where):
    infos = {"input": graph.input, "output": graph.output, "value_info": graph.value_info}[where]
    return [v.type.tensor_type for v in infos]


def _mutate(model: onnx.ModelProto, mutation) -> None:
    graph = model.graph
    kind, *args = mutation
    if kind == "shape":
        where, i, pos, value = args
        target = _pick(_tensor_types(graph, where), i)
        if target is None:
            return
        if pos == -3:
            target.ClearField("shape")
            return
        dims = target.shape.dim
        if pos == -2:
            if len(dims):
                del dims[len(dims) - 1]
            return
        item = dims.add() if pos == -1 or not len(dims) else dims[pos % len(dims)]
        item.Clear()
        if isinstance(value, str):
            item.dim_param = value
        else:
            item.dim_value = value
    elif kind == "shape_run":
        where, i, count, value = args
        target = _pick(_tensor_types(graph, where), i)
        if target is not None:
            del target.shape.dim[:]
            for _ in range(count):
                target.shape.dim.add().dim_value = value
    elif kind == "init_dims":
        i, dims, resize = args
        tensor = _pick(graph.initializer, i)
        if tensor is None:
            return
        if resize and all(0 <= d for d in dims) and np.prod(dims, dtype=float) <= 4096:
            array = numpy_helper.to_array(tensor)
            flat = np.resize(array.reshape(-1), int(np.prod(dims, dtype=np.int64)))
            tensor.CopyFrom(numpy_helper.from_array(flat.reshape(dims).astype(array.dtype),
                                                    tensor.name))
        else:
            tensor.dims[:] = dims
    elif kind == "init_values":
        i, values = args
        tensor = _pick(graph.initializer, i)
        if tensor is None:
            return
        array = numpy_helper.to_array(tensor)
        if array.size == 0:
            return
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if np.issubdtype(array.dtype, np.integer):
                info = np.iinfo(array.dtype)
                new = [int(min(max(v, info.min), info.max)) if np.isfinite(v) else 0
                       for v in values]
            else:
                new = values
            flat = array.reshape(-1).copy()
            flat[:len(new)] = np.asarray(new[:flat.size]).astype(array.dtype)
        tensor.CopyFrom(numpy_helper.from_array(flat.reshape(array.shape), tensor.name))
    elif kind == "init_raw":
        i, data = args
        tensor = _pick(graph.initializer, i)
        if tensor is not None:
            for field in ("float_data", "int32_data", "int64_data", "double_data",
                          "uint64_data", "string_data"):
                tensor.ClearField(field)
            tensor.raw_data = data
    elif kind == "init_field":
        i, field = args
        tensor = _pick(graph.initializer, i)
        if tensor is None:
            return
        if field == "external":
            tensor.data_location = TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value="missing.bin")
            return
        raw = tensor.raw_data
        tensor.ClearField("raw_data")
        words = np.frombuffer(raw[:len(raw) // 8 * 8], np.int64).tolist()
        if field == "float_data":
            tensor.float_data.extend(np.frombuffer(raw[:len(raw) // 4 * 4], np.float32))
        elif field == "double_data":
            tensor.double_data.extend(np.frombuffer(raw[:len(raw) // 8 * 8], np.float64))
        elif field == "string_data":
            tensor.string_data.append(raw)
        elif field == "uint64_data":
            tensor.uint64_data.extend(w % (1 << 64) for w in words)
        else:
            values = np.frombuffer(raw[:len(raw) // 4 * 4], np.int32).tolist()
            getattr(tensor, field).extend(values if field == "int32_data" else words)
    elif kind == "dtype":
        where, i, dtype = args
        if where == "init":
            tensor = _pick(graph.initializer, i)
            if tensor is not None:
                tensor.data_type = dtype
        else:
            target = _pick(_tensor_types(graph, where), i)
            if target is not None:
                target.elem_type = dtype
    elif kind == "attr":
        i, name, value = args
        node = _pick(graph.node, i)
        if node is None:
            return
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(kept)
        if value is None:
            return
        if isinstance(value, tuple):
            value = helper.make_tensor("t", TensorProto.FLOAT, [len(value[1])], value[1])
        if isinstance(value, list) and not value:
            node.attribute.append(helper.make_attribute(name, [], attr_type=AttributeProto.INTS))
        else:
            node.attribute.append(helper.make_attribute(name, value))
    elif kind == "attr_type":
        i, j, attr_type = args
        node = _pick(graph.node, i)
        attribute = _pick(node.attribute, j) if node is not None else None
        if attribute is not None:
            attribute.type = attr_type
    elif kind == "io":
        i, side, slot, how, k = args
        node = _pick(graph.node, i)
        if node is None:
            return
        values = node.input if side == "input" else node.output
        names = _value_names(graph)
        if how == "append":
            values.append(_pick(names, k))
        elif not len(values):
            return
        elif how == "drop":
            del values[slot % len(values)]
        else:
            values[slot % len(values)] = {"other": _pick(names, k), "empty": "",
                                          "fresh": f"ghost{k}"}[how]
    elif kind == "op_type":
        i, op = args
        node = _pick(graph.node, i)
        if node is not None:
            node.op_type = op
    elif kind == "domain":
        i, domain = args
        node = _pick(graph.node, i)
        if node is not None:
            node.domain = domain
    elif kind == "node":
        i, action = args
        nodes = list(graph.node)
        if not nodes:
            return
        at = i % len(nodes)
        node = nodes[at]
        if action == "delete":
            del nodes[at]
        elif action == "duplicate":
            nodes.insert(at, node)
        elif action == "first":
            nodes.insert(0, nodes.pop(at))
        elif action == "last":
            nodes.append(nodes.pop(at))
        elif at + 1 < len(nodes):
            nodes[at], nodes[at + 1] = nodes[at + 1], nodes[at]
        copies = [onnx.NodeProto() for _ in nodes]
        for copy, original in zip(copies, nodes):
            copy.CopyFrom(original)
        del graph.node[:]
        graph.node.extend(copies)
    elif kind == "opset":
        which, version, domain = args
        if which == "ir":
            model.ir_version = max(version, 0)
        elif which == "default":
            for opset in model.opset_import:
                if opset.domain in ("", "ai.onnx"):
                    opset.version = version
        else:
            model.opset_import.append(helper.make_opsetid(domain, version))
    elif kind == "graph_io":
        action, i = args
        if action == "drop_input" and len(graph.input):
            del graph.input[i % len(graph.input)]
        elif action == "drop_output" and len(graph.output):
            del graph.output[i % len(graph.output)]
        elif action == "duplicate_output" and len(graph.output):
            graph.output.append(graph.output[i % len(graph.output)])
        elif action == "output_intermediate":
            name = _pick([o for node in graph.node for o in node.output], i)
            if name:
                graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                                  None))
        elif action == "input_initializer":
            tensor = _pick(graph.initializer, i)
            if tensor is not None:
                graph.input.append(helper.make_tensor_value_info(
                    tensor.name, tensor.data_type, list(tensor.dims)))
        elif action == "input_unused":
            graph.input.append(helper.make_tensor_value_info(f"unused{i}", TensorProto.FLOAT,
                                                             [1, 3]))


def mutated(seed_name: str, mutations) -> bytes:
    """The seed model ``seed_name`` with ``mutations`` applied, serialized. A mutation that
    cannot be applied (a value protobuf or onnx.helper refuses) is skipped: the fuzzer tests
    hwonnx, not the protobuf library."""
    model = SEEDS[seed_name]()
    for mutation in mutations:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        try:
            _mutate(copy, mutation)
            copy.SerializeToString()
        except Exception:                   # noqa: BLE001 - an inapplicable mutation
            continue
        model = copy
    return model.SerializeToString()


# Running one case ------------------------------------------------------------------------

class WrongResult(Exception):
    """A model was read or built, but the result is not correct; ``kind`` names the check
    (and where the evaluator failed) for grouping."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _Alarm(BaseException):
    pass


def _quiet(message):
    pass


def _feeds(graph, rng, samples: int = 1) -> "dict[str, np.ndarray] | None":
    """Random samples ``[samples, *shape]`` of every graph input in its type; None if an
    input is too large, or of a type that is not a number."""
    feeds = {}
    for name in graph.inputs:
        shape = tuple(graph.types[name].shape)
        try:
            dtype = np.dtype(graph.types[name].dtype)
        except TypeError:
            return None
        if np.prod(shape, dtype=float) > MAX_FEED_ELEMENTS:
            return None
        shape = (samples,) + shape
        if np.issubdtype(dtype, np.inexact):
            feeds[name] = rng.uniform(-1, 1, shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            feeds[name] = rng.integers(max(info.min, -128), min(info.max, 127) + 1,
                                       shape).astype(dtype)
        else:
            return None
    return feeds


def run_case(data: bytes) -> str:
    """Load, evaluate and build one model; returns the outcome (``refused at load``,
    ``refused at build``, ``built``, ...). Raises WrongResult or whatever hwonnx raised
    other than a HwonnxError."""
    rng = np.random.default_rng(zlib.crc32(data))
    try:
        graph = load_model(data)
    except HwonnxError:
        return "refused at load"
    one = _feeds(graph, rng)
    if one is not None:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")       # a float model may overflow: not a failure
            try:
                values = evaluate_float(graph, {k: v[0] for k, v in one.items()})
            except Exception as error:          # noqa: BLE001 - any failure is a wrong result
                raise WrongResult(f"the loaded graph does not evaluate ({type(error).__name__} "
                                  f"in {_where(error)})",
                                  f"{type(error).__name__}: {error}") from error
        for name in graph.outputs:
            got = np.shape(values.get(name))
            if got != tuple(graph.types[name].shape):
                raise WrongResult("an output's shape is not the declared one",
                                  f"output '{name}' has shape {got}, the graph declares "
                                  f"{graph.types[name].shape}")
    calib = _feeds(graph, rng, 4)
    try:
        result = build(data, None, calib=calib, verilog=False, log=_quiet)
    except HwonnxError:
        return "refused at build" if calib is not None else "refused at build (no calib)"
    encode_program(result.program)
    if calib is None:
        return "built (input too large to run)"
    golden = run_golden(result, _feeds(graph, rng, 2))
    for name, value in golden.outputs.items():
        if np.issubdtype(np.asarray(value).dtype, np.inexact) and not np.isfinite(value).all():
            raise WrongResult("the golden output is not finite",
                              f"golden output '{name}' is not finite")
    return "built"


def _where(error: BaseException) -> str:
    """The innermost hwonnx line of the traceback (else the innermost line)."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if f.filename.startswith(HWONNX)] or frames[-1:]
    if not ours:
        return "?"
    frame = ours[-1]
    return f"{os.path.relpath(frame.filename, os.path.dirname(HWONNX))}:{frame.lineno}"


def _attempt(data: bytes, warning_filter: str) -> "tuple[str, str | None, str]":
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(warning_filter)
            return run_case(data), None, ""
    except _Alarm as error:
        return "hang", f"hang in {_where(error)}", f"no result in {PER_CASE_SECONDS} s"
    except MemoryError as error:
        return "memory blow-up", f"MemoryError in {_where(error)}", str(error)
    except WrongResult as error:
        return "wrong result", f"wrong result: {error.kind}", str(error)
    except Warning as error:
        return "warning", f"{type(error).__name__} in {_where(error)}", str(error)
    except Exception as error:                  # noqa: BLE001 - the failures we look for
        return "crash", f"{type(error).__name__} in {_where(error)}", str(error)


def classify(data: bytes) -> "tuple[str, str | None, str]":
    """``(outcome, failure class or None, message)`` of one case, within the time limit.
    Warnings are errors, as in the test suite; after one the case runs again with warnings
    ignored, and the message says how that ends. A case that grows the peak memory of the
    process by more than a GiB is a blow-up even if it ends well."""
    def expire(signum, frame):
        raise _Alarm()

    previous = signal.signal(signal.SIGALRM, expire)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    signal.setitimer(signal.ITIMER_REAL, PER_CASE_SECONDS)
    try:
        outcome, failure, message = _attempt(data, "error")
        if outcome == "warning":
            signal.setitimer(signal.ITIMER_REAL, PER_CASE_SECONDS)
            then, other, more = _attempt(data, "ignore")
            message += f" (with warnings ignored: {then}{': ' + other if other else ''})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / (1 << 20)  # GiB
    if grown > 1 and failure is None:
        return "memory blow-up", "memory blow-up: peak memory grew by more than 1 GiB", \
            f"peak memory grew by {grown:.1f} GiB ({outcome})"
    return outcome, failure, message


# The tests -------------------------------------------------------------------------------

@contextlib.contextmanager
def memory_cap():
    """Cap the address space at its current size plus MEMORY_HEADROOM."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as stream:
        in_use = int(stream.read().split()[0]) * resource.getpagesize()
    cap = in_use + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _reproducer(seed_name: str, mutations) -> str:
    return (f"# in tests/:\n"
            f"from test_fuzz_build import mutated, run_case\n"
            f"run_case(mutated({seed_name!r}, {mutations!r}))")


def fuzz(block_seed: int, examples: int) -> dict:
    """Run ``examples`` Hypothesis cases; count outcomes and group failures by class."""
    outcomes, failures = Counter(), {}

    @seed(block_seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=CASES)
    def generate(case):
        # a watchdog for a hang the alarm cannot interrupt (in C code): stacks, then exit
        faulthandler.dump_traceback_later(6 * PER_CASE_SECONDS, exit=True)
        outcome, failure, message = classify(mutated(*case))
        faulthandler.cancel_dump_traceback_later()
        outcomes[outcome] += 1
        if failure:
            entry = failures.setdefault(failure, {"count": 0, "outcome": outcome,
                                                  "message": message, "case": case})
            entry["count"] += 1
            if _size(case) < _size(entry["case"]):
                entry["case"], entry["message"] = case, message

    with memory_cap():
        generate()
        for failure, entry in failures.items():
            entry["case"] = _shrink(failure, entry["case"])
    return {"outcomes": outcomes, "failures": failures}


def _size(case) -> "tuple[int, int]":
    return len(case[1]), len(repr(case))


def _shrink(failure: str, case):
    """A minimal case of ``failure``: the smallest sub-list of the case's mutations that
    still fails the same way (Hypothesis's shrinker over those sub-lists)."""
    seed_name, mutations = case
    if len(mutations) == 1:
        return case

    def same(candidate):
        return classify(mutated(*candidate))[1] == failure

    try:
        return find(st.tuples(st.just(seed_name), st.lists(st.sampled_from(mutations),
                                                           min_size=1,
                                                           max_size=len(mutations))),
                    same, settings=settings(max_examples=100, database=None, deadline=None,
                                            suppress_health_check=list(HealthCheck)),
                    random=Random(0))
    except (NoSuchExample, Unsatisfiable):
        return case


def _report(result: dict) -> str:
    lines = []
    for failure, entry in sorted(result["failures"].items(), key=lambda i: -i[1]["count"]):
        seed_name, mutations = entry["case"]
        message = classify(mutated(seed_name, mutations))[2] or entry["message"]
        lines.append(f"{failure} ({entry['outcome']}, {entry['count']} case(s)): "
                     f"{message[:300]}\n{_reproducer(seed_name, mutations)}")
    return "\n\n".join(lines)


#: Failure classes (prefixes of ``classify``'s class names) to report as expected failures,
#: with the reason: the test then xfails when every failure it finds is one of them, and
#: fails on any other. Empty: every failure fails the test.
KNOWN_FAILURES: "dict[str, str]" = {}


def _check(name: str, block: int, examples: int) -> None:
    block_seed = zlib.crc32(f"fuzz-build/{name}/{block}".encode())
    result = fuzz(block_seed, examples)
    outcomes, failures = result["outcomes"], result["failures"]
    log = os.environ.get("HWONNX_RELIABILITY_LOG")
    if log:
        with open(log, "a") as stream:
            stream.write(json.dumps({"kind": "fuzz-build", "tier": name, "block": block,
                                     "seed": block_seed, "cases": sum(outcomes.values()),
                                     "outcomes": outcomes,
                                     "failures": {k: {"count": v["count"],
                                                      "outcome": v["outcome"],
                                                      "message": v["message"][:300],
                                                      "case": repr(v["case"])}
                                                  for k, v in failures.items()}}) + "\n")
    print(f"\n{sum(outcomes.values())} cases: {dict(outcomes)}")
    assert sum(outcomes.values()) >= examples
    assert outcomes["built"] > 0 and outcomes["refused at load"] > 0, outcomes
    if not failures:
        return
    report = (f"{len(failures)} failure class(es) in {sum(outcomes.values())} cases "
              f"(seed {block_seed}):\n\n{_report(result)}")
    known = {k: reason for k, reason in KNOWN_FAILURES.items()
             if any(failure.startswith(k) for failure in failures)}
    if all(any(failure.startswith(k) for k in known) for failure in failures):
        pytest.xfail("known failures: " + "; ".join(known.values()) + "\n\n" + report)
    pytest.fail(report, pytrace=False)


def test_seed_models_build():
    """Every seed is valid and builds to a program with a finite golden output."""
    for name in SEEDS:
        assert classify(SEEDS[name]().SerializeToString()) == ("built", None, ""), name


@pytest.mark.parametrize("block", range(SMOKE[1]))
def test_fuzz_build_smoke(block):
    _check("smoke", block, SMOKE[0])


@pytest.mark.slow
@pytest.mark.parametrize("block", range(SLOW[1]))
def test_fuzz_build(block):
    _check("slow", block, SLOW[0])


@pytest.mark.parametrize("seed_name, mutations", [
    ("qdq", [("op_type", 8, "Mul")]),              # a Mul with one input
    ("mlp", [("op_type", 32, "TopK")]),            # a TopK without K
    ("cnn", [("init_dims", 34, [0], True)]),       # a Pad whose constant value is empty
], ids=["one-input-Mul", "TopK-without-K", "empty-Pad-value"])
def test_found_by_the_slow_tier(seed_name, mutations):
    """Classes the slow tier found (IndexError in the support check and the Pad converter),
    shrunk: each is now refused at load with an hwonnx error."""
    assert run_case(mutated(seed_name, mutations)) == "refused at load"
