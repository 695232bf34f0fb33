"""The cases of ``test_fuzz_build``: small buildable seed models (a CNN, an MLP, a residual
block, a QDQ model) and the Hypothesis strategy of their mutations (``CASES``: a seed and one
to three mutations of protobuf fields), applied by :func:`mutated`; and the random inputs a
mutated model runs on (:func:`random_feeds`, also in ``test_fuzz_regressions``)."""

import warnings

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper, numpy_helper

__all__ = ["CASES", "SEEDS", "mutated", "random_feeds", "MAX_FEED_ELEMENTS"]


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
        return [n("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"],
                  name=f"q_{name}"),
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


# Inputs of a mutated model ---------------------------------------------------------------

MAX_FEED_ELEMENTS = 1 << 18         # larger inputs are not evaluated (build without calib)


def random_feeds(graph, rng, samples: int = 1) -> "dict[str, np.ndarray] | None":
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
