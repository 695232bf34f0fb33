"""Binary element-wise operators between two computed tensors (Add with broadcasting, Sub, Mul,
Max, Min, Sum, Mean): the golden op against onnxruntime's QDQ reference path on every pair of
int8 inputs, the frontend mapping and its refusals, and the quantized graph against the float
model within the stated bound."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.compiler import lower
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError, UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.golden import dequantize, evaluate, qeltwise
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.isa import Op
from hwonnx.quant import activation_params, quantize_graph, requant_params
from hwonnx.quant.eltwise import ELTWISE_UNIT, eltwise_constants
from ort_reference import reference_session
from helpers import raises
from spec_helpers import check_against_ort, make_model, rand

ONNX_OPS = {"add": "Add", "sub": "Sub", "mul": "Mul", "max": "Max", "min": "Min",
            "mean": "Mean"}
FLOAT = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
         "min": np.minimum, "mean": lambda a, b: (a + b) / 2}


# Golden op -----------------------------------------------------------------------------------

def test_qeltwise_golden_by_hand():
    a = np.array([[[[10, -3]], [[127, -128]]]], np.int8)          # [1, 2, 1, 2]
    b = np.array([[[[4]], [[-6]]]], np.int8)                      # [1, 2, 1, 1]: per channel
    one = (np.full(2, 1 << 30, np.int32), np.full(2, 30, np.int32))
    half = (np.full(2, 1 << 30, np.int32), np.full(2, 31, np.int32))
    common = dict(za=1, zb=-2, out_zp=0, lo=-128, hi=127)
    # sum: 2 (a - 1) - 1 (b + 2)
    y = qeltwise(a, b, *one, mode="sum", mul=False, ka=2, kb=-1, **common)
    np.testing.assert_array_equal(y, [[[[12, -14]], [[127, -128]]]])
    # mul: (a - 1)(b + 2) / 2: 9 * 6 / 2 = 27, -4 * 6 / 2 = -12; 126 * -4, -129 * -4 saturate
    y = qeltwise(a, b, *half, mode="sum", mul=True, ka=0, kb=0, **common)
    np.testing.assert_array_equal(y, [[[[27, -12]], [[-128, 127]]]])
    # max / min of 1 (a - 1) and 3 (b + 2), with a fused ReLU (lo = zp)
    y = qeltwise(a, b, *one, mode="max", mul=False, ka=1, kb=3, **{**common, "lo": 0})
    np.testing.assert_array_equal(y, [[[[18, 18]], [[126, 0]]]])
    y = qeltwise(a, b, *one, mode="min", mul=False, ka=1, kb=3, **common)
    np.testing.assert_array_equal(y, [[[[9, -4]], [[-12, -128]]]])


def _qdq_model(kind, pa, pb, po):
    """a_q, b_q int8 -> DequantizeLinear -> op -> QuantizeLinear: onnxruntime's reference."""
    inits = {}
    nodes = []
    for name, (s, z) in (("a", pa), ("b", pb), ("y", po)):
        inits[f"{name}_s"] = np.float32(s)
        inits[f"{name}_z"] = np.int8(z)
    nodes = [helper.make_node("DequantizeLinear", ["a_q", "a_s", "a_z"], ["a"]),
             helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"]),
             helper.make_node(ONNX_OPS[kind], ["a", "b"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "y_s", "y_z"], ["y_q"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info(v, TensorProto.INT8, [1, 256, 256, 1])
                       for v in ("a_q", "b_q")],
        [helper.make_tensor_value_info("y_q", TensorProto.INT8, [1, 256, 256, 1])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", sorted(ONNX_OPS))
def test_golden_within_one_lsb_of_onnxruntime_on_every_input_pair(kind, seed):
    """Every pair of int8 inputs (65,536), random scales and zero points, the output's from
    the float range: the golden op (the quantizer's constants) differs from onnxruntime's
    QDQ reference path by at most 1 LSB, and only where the exact result is within the error
    of a rounding tie (ties: half up against half to even; the 2**-17 relative error of
    ``ka/kb``; float32 rounding)."""
    rng = np.random.default_rng(seed)
    pa = (float(rng.uniform(0.002, 0.05)), int(rng.integers(-128, 128)))
    pb = (float(pa[0] * rng.choice([1.0, rng.uniform(0.01, 100)])),
          int(rng.integers(-128, 128)))
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    a, b = (v.astype(np.int8).reshape(1, 256, 256, 1) for v in (a, b))
    real = FLOAT[kind](dequantize(a, scale=pa[0], zero_point=pa[1]).astype(np.float64),
                       dequantize(b, scale=pb[0], zero_point=pb[1]).astype(np.float64))
    po = activation_params(real.min(), real.max())
    attrs, m = eltwise_constants(kind, pa, pb, po[0], (1, -1) if kind == "sub" else (1, 1))
    mult, shift = requant_params(np.full(256, m), "elt")
    got = qeltwise(a, b, mult, shift, **attrs, out_zp=po[1], lo=-128, hi=127)
    (want,) = reference_session(_qdq_model(kind, pa, pb, po)).run(None, {"a_q": a, "b_q": b})
    diff = np.abs(got.astype(int) - want.astype(int))
    # where they differ, the exact result lies within the error of the integer weights
    # (255 max(sa, sb) 2**-17 per input) plus float32 rounding of a rounding boundary
    level = real / po[0]
    tie = np.abs(level - np.floor(level) - 0.5)
    tolerance = (0 if kind == "mul" else 255 * max(pa[0], pb[0]) / ELTWISE_UNIT / po[0]) + 1e-4
    print(f"\n{kind} seed {seed}: scales {pa[0]:.4g}/{pb[0]:.4g} -> {po[0]:.4g}, ka "
          f"{attrs['ka']} kb {attrs['kb']}: {int((diff > 0).sum())} of {diff.size} differ, "
          f"max {diff.max()}, farthest from a tie {tie[diff > 0].max(initial=0):.2g} LSB "
          f"(tolerance {tolerance:.2g})")
    assert diff.max() <= 1
    assert (tie[diff > 0] <= tolerance).all()


def test_the_larger_scale_gets_the_unit_and_a_sub_negates():
    attrs, real = eltwise_constants("sub", (0.5, 3), (0.125, -4), 0.25, (1, -1))
    assert (attrs["ka"], attrs["kb"], attrs["za"], attrs["zb"]) == (
        ELTWISE_UNIT, -ELTWISE_UNIT // 4, 3, -4)
    assert real == 0.5 / ELTWISE_UNIT / 0.25
    attrs, real = eltwise_constants("mul", (0.5, 3), (0.125, -4), 0.25)
    assert (attrs["mode"], attrs["mul"], attrs["ka"], attrs["kb"], real) == (
        "sum", True, 0, 0, 0.25)


# Frontend, quantizer and the float model -----------------------------------------------------

def _two_branch(op, order=("a", "b"), b_shape=(1, 4, 1, 1), extra=()):
    """x -> Conv a [1, 4, 4, 5]; x -> GlobalAveragePool -> Conv b [1, 4, 1, 1] (or a second
    Conv [1, 4, 4, 5]) -> op(order) -> extra."""
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a")]
    if b_shape == (1, 4, 1, 1):
        nodes += [helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
                  helper.make_node("Conv", ["g", "wb"], ["b"], name="conv_b")]
    else:
        nodes += [helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1] * 4)]
    nodes += [helper.make_node(op, list(order), ["e"], name="elt"), *extra]
    out = extra[-1].output[0] if extra else "e"
    wb = rand(4, 3, 1, 1, seed=2) if b_shape == (1, 4, 1, 1) else rand(4, 3, 3, 3, seed=2)
    return make_model(nodes, {"x": [1, 3, 4, 5]}, {out: [1, 4, 4, 5]},
                      {"wa": rand(4, 3, 1, 1, seed=1), "wb": wb * 3})


CASES = [("Add", ("a", "b"), (1, 4, 1, 1)), ("Add", ("b", "a"), (1, 4, 1, 1)),
         ("Sub", ("a", "b"), (1, 4, 4, 5)), ("Sub", ("b", "a"), (1, 4, 1, 1)),
         ("Mul", ("a", "b"), (1, 4, 4, 5)), ("Mul", ("b", "a"), (1, 4, 1, 1)),
         ("Max", ("a", "b"), (1, 4, 4, 5)), ("Min", ("b", "a"), (1, 4, 1, 1)),
         ("Sum", ("a", "b"), (1, 4, 4, 5)), ("Mean", ("a", "b"), (1, 4, 1, 1))]


@pytest.mark.parametrize("op, order, b_shape", CASES)
def test_quantized_graph_follows_the_float_operator(op, order, b_shape):
    """The golden element-wise output against the float operator on the golden's own
    dequantized inputs (clamped to the output's range): within half an output step plus the
    error of the integer weights, ``255 max(sa, sb) 2**-17`` per input (Mul: none). And the
    whole quantized graph stays close to the float graph."""
    model = _two_branch(op, order, b_shape)
    graph = load_model(model)
    node = graph.nodes[-1]
    kind = {"Sum": "add"}.get(op, op.lower())
    assert (node.op, node.attrs["kind"]) == ("Eltwise", kind)
    rng = np.random.default_rng(1)
    samples = rng.uniform(-1, 1, (48, 1, 3, 4, 5)).astype(np.float32)
    qgraph = quantize_graph(graph, {"x": samples})
    q = next(n for n in qgraph.nodes if n.op == "QEltwise")
    assert qgraph.types[q.inputs[0]].shape == (1, 4, 4, 5)   # the image first
    env = evaluate(qgraph, {"x": samples[:, 0]}, keep_all=True)
    params = {q.inputs[0]: (q.attrs["a_scale"], q.attrs["za"]),
              q.inputs[1]: (q.attrs["b_scale"], q.attrs["zb"])}
    a, b = (dequantize(env[f"{v}:q"], scale=params[f"{v}:q"][0],
                       zero_point=params[f"{v}:q"][1]).astype(np.float64) for v in order)
    so, zo = q.attrs["out_scale"], q.attrs["out_zp"]
    want = np.clip(FLOAT[kind](a, b), (-128 - zo) * so, (127 - zo) * so)
    got = dequantize(env["e:q"], scale=so, zero_point=zo)
    weights = 0 if kind == "mul" else 255 * max(q.attrs["a_scale"], q.attrs["b_scale"]) / (
        2 * ELTWISE_UNIT) * (0.5 if kind == "mean" else 1)
    bound = so / 2 + 2 * weights
    error = np.abs(got - want).max()
    whole = np.abs(env["e"] - evaluate_float(graph, {"x": samples[:, 0]})["e"]).max()
    print(f"\n{op}{order} {b_shape}: max |golden - float op| {error:.4g} (bound {bound:.4g}); "
          f"whole graph {whole:.4g} (output step {so:.4g})")
    assert error <= bound * (1 + 1e-6)
    assert whole <= 4 * so


def test_relu_after_an_element_wise_op_is_fused():
    relu = helper.make_node("Relu", ["e"], ["r"], name="relu")
    graph = load_model(_two_branch("Mul", extra=[relu]))
    assert [(n.op, n.attrs.get("relu")) for n in graph.nodes][-1] == ("Eltwise", True)
    qgraph = quantize_graph(graph, {"x": rand(16, 1, 3, 4, 5, seed=4)})
    q = next(n for n in qgraph.nodes if n.op == "QEltwise")
    assert q.attrs["lo"] == q.attrs["out_zp"] == -128


def _refusal(op, name, reason):
    return raises(UnsupportedOperatorError, f"1 unsupported node(s): node '{name}' {op} "
                  f"(domain 'ai.onnx', opset 17) ({reason})")


def test_div_of_two_computed_tensors_is_a_host_step():
    # no exact integer formulation on the engine: the host divides, between two segments
    graph = load_model(_two_branch("Div", b_shape=(1, 4, 4, 5)))
    assert graph.meta["host_steps"]["elt"]["at"] == "middle"
    assert [n.op for n in graph.nodes][-1] == "Div"


def test_a_computed_scalar_is_spread_per_channel():
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("ReduceMean", ["a"], ["s"], name="mean", keepdims=1),
             helper.make_node("Mul", ["a", "s"], ["e"], name="elt")]
    model = make_model(nodes, {"x": [1, 3, 4, 5]}, {"e": [1, 4, 4, 5]},
                       {"wa": rand(4, 3, 1, 1, seed=1)})
    with pytest.raises(UnsupportedOperatorError):           # ReduceMean has no mapping
        load_model(model)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("Conv", ["x", "ws"], ["s"], name="conv_s", pads=[0, 0, 0, 0],
                              strides=[4, 5]),
             helper.make_node("Mul", ["a", "s"], ["e"], name="elt")]
    model = make_model(nodes, {"x": [1, 3, 4, 5]}, {"e": [1, 4, 4, 5]},
                       {"wa": rand(4, 3, 1, 1, seed=1), "ws": rand(1, 3, 4, 5, seed=2)})
    graph = load_model(model)          # (the RTL: tests/operators/test_scalar_broadcast.py)
    assert [n.op for n in graph.nodes] == ["Conv", "Conv", "Conv", "Eltwise"]
    spread = graph.nodes[2]
    assert spread.name == "elt:spread" and spread.attrs["copy"]
    assert graph.types[spread.outputs[0]].shape == (1, 4, 1, 1)


def test_max_with_a_constant_and_a_max_of_three_are_refused_by_name():
    nodes = [helper.make_node("Max", ["x", "c"], ["y"], name="floor")]
    model = make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]}, {"c": np.zeros(4, np.float32)})
    with _refusal("Max", "floor", (
            "Max 'floor' combines the constant 'c' with a computed tensor; the element-wise "
            "engine maps Max of two computed tensors only")):
        load_model(model)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["a"], name="fc"),
             helper.make_node("Max", ["x", "a", "x"], ["y"], name="max3")]
    model = make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]}, {"w": rand(4, 4)})
    with _refusal("Max", "max3", (
            "Max 'max3' has 3 inputs; the element-wise engine combines two")):
        load_model(model)


# Lowering ------------------------------------------------------------------------------------

def _lowered(model, config):
    graph = quantize_graph(load_model(model), {"x": rand(16, 1, 3, 4, 5, seed=4)})
    return graph, lower(graph, config)


def test_lowering_one_eltw_and_post_per_channel_block_and_broadcast_stride():
    """SE-style Mul of a [1, 4, 4, 5] image by a [1, 4, 1, 1] gate on a 3x5 array: two
    channel blocks (3 + 1 channels), the gate's word j for every pixel (b_stride 0), the
    layer's first ELTW waits for the post-processor, and the POSTs write word j of each
    pixel with the block's channels only."""
    config = ArchConfig(rows=3, cols=5, acc_depth=64)
    graph, program = _lowered(_two_branch("Mul", ("b", "a")), config)
    q = next(n for n in graph.nodes if n.op == "QEltwise")
    index = next(i for i, layer in enumerate(program.layers) if layer.op == "QEltwise")
    mine = [i.fields for i in program.instructions if i.layer == index and i.op != Op.END]
    out, a, b = (program.placements[v] for v in (q.outputs[0], *q.inputs[:2]))
    assert [i["op"] for i in mine] == [Op.ELTW, Op.POST, Op.ELTW, Op.POST]
    assert [(i["wait"], i["count"], i["a_addr"], i["a_stride"], i["b_addr"], i["b_stride"])
            for i in mine[::2]] == [(1, 20, a.base, 2, b.base, 0),
                                    (0, 20, a.base + 1, 2, b.base + 1, 0)]
    assert [(i["acc_addr"], i["mode"], i["mul"]) for i in mine[::2]] == [
        (mine[1]["acc_addr"], 0, 1), (mine[3]["acc_addr"], 0, 1)]
    assert mine[1]["acc_addr"] != mine[3]["acc_addr"]          # the two halves
    assert [(i["out_addr"], i["out_stride"], i["nw"], i["nt"]) for i in mine[1::2]] == [
        (out.base, 2, 1, 3), (out.base + 1, 2, 1, 1)]
    assert program.layers[index].macs == 0


def test_an_array_with_fewer_columns_than_rows_is_refused_by_name():
    with raises(ResourceError, (
            "Layer 'elt' runs on the element-wise engine, which writes the 4 lanes of an "
            "activation word into one accumulator word; the 4x3 array has only 3 columns (use "
            "an array with at least as many columns as rows)")):
        _lowered(_two_branch("Sub", b_shape=(1, 4, 4, 5)), ArchConfig(rows=4, cols=3))


def test_a_reshaped_vector_operand_is_refused_by_name():
    """A Flatten of a 3-channel image is pixel-major, not in the [1, K] order of a Gemm."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Flatten", ["c"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wg"], ["g"], name="fc"),
             helper.make_node("Sub", ["f", "g"], ["y"], name="elt")]
    model = make_model(nodes, {"x": [1, 3, 4, 5]}, {"y": [1, 60]},
                       {"w": rand(3, 3, 1, 1), "wg": rand(60, 60)})
    with raises(ResourceError, "Layer 'elt': its first input is a reshaped tensor that is not "
                               "in its natural [1, C, H, W] or [1, K] order"):
        _lowered(model, ArchConfig())


def test_an_architecture_without_the_engine_refuses_by_name():
    with raises(ResourceError, (
            "Layer 'elt' needs the element-wise engine, which the 8x8 architecture leaves out "
            "(ArchConfig.eltwise); use a board or configuration that has it")):
        _lowered(_two_branch("Max", b_shape=(1, 4, 4, 5)), ArchConfig(eltwise=False))


@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_sum_and_mean_of_several_inputs_chain_two_input_sums(op):
    """Sum/Mean of four computed tensors (one per-channel): three engine layers, the partial
    sums calibrated like any value; the quantized graph stays within a few output steps of
    the float model (each partial sum rounds once more), and the float graph equals
    onnxruntime."""
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"], name=f"conv{i}")
             for i in range(3)]
    nodes += [helper.make_node("GlobalAveragePool", ["c0"], ["g"], name="gap"),
              helper.make_node(op, ["c0", "c1", "g", "c2"], ["y"], name="total")]
    model = make_model(nodes, {"x": [1, 3, 4, 5]}, {"y": [1, 4, 4, 5]},
                       {f"w{i}": rand(4, 3, 1, 1, seed=i) * (i + 1) for i in range(3)})
    graph = check_against_ort(model, rtol=1e-4, atol=1e-5)
    chain = [n for n in graph.nodes if n.op == "Eltwise"]
    assert [(n.name, n.inputs, n.outputs, n.attrs["kind"]) for n in chain] == [
        ("total:sum1", ("c0", "c1"), ("y:sum1",), "add"),
        ("total:sum2", ("y:sum1", "g"), ("y:sum2",), "add"),
        ("total", ("y:sum2", "c2"), ("y",), "mean" if op == "Mean" else "add")]
    assert chain[-1].attrs.get("count") == (4 if op == "Mean" else None)
    samples = rand(32, 1, 3, 4, 5, seed=5)
    qgraph = quantize_graph(graph, {"x": samples})
    assert sum(n.op == "QEltwise" for n in qgraph.nodes) == 3
    got = evaluate(qgraph, {"x": samples[:, 0]})["y"]
    want = evaluate_float(graph, {"x": samples[:, 0]})["y"]
    so = next(n for n in qgraph.nodes if n.name == "total").attrs["out_scale"]
    print(f"\n{op} of 4: max |golden - float| {np.abs(got - want).max():.4g} (step {so:.4g})")
    assert np.abs(got - want).max() <= 4 * so


# Pre-quantized models ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["se_gate", "glu"])
def test_prequantized_qdq_model_follows_onnxruntimes_reference(tmp_path, name):
    """onnxruntime's QDQ quantizer (per channel, int8) on an SE gate and on a gated unit
    (conv_a * sigmoid(conv_b)): hwonnx uses
    the model's own scales and zero points, and the golden ``Mul`` output equals onnxruntime's
    reference path (DequantizeLinear -> Mul -> QuantizeLinear) within 1 LSB wherever both
    computed the same int8 inputs. (The reference path runs the Conv in float32, which can
    land on the other side of a rounding boundary: docs/arithmetic.md; such an input
    difference reaches the Mul's operands.)"""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    from tests.operators.test_eltwise_rtl import MODELS

    make, shape = MODELS[name]
    model, node = make(np.random.default_rng(0))
    data = np.random.default_rng(1).uniform(-1, 1, (32, *shape)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": sample} for sample in data])

        def get_next(self):
            return next(self.samples, None)

    onnx.save(model, tmp_path / "float.onnx")
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    qdq = onnx.load(str(tmp_path / "qdq.onnx"))
    qgraph = quantize_graph(load_model(qdq), None)
    q = next(n for n in qgraph.nodes if n.op == "QEltwise")
    assert q.name == node
    # the reference's int8 values of the Mul's inputs and output, as extra outputs
    values = [v.removesuffix(":q") for v in (*q.inputs[:2], "y:q")]
    quantized = {n.input[0]: n.output[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    qdq.graph.output.extend(helper.make_tensor_value_info(quantized[v], TensorProto.INT8, None)
                            for v in values[:2])
    session = reference_session(qdq)
    runs = [session.run(None, {"x": sample}) for sample in data]
    a_ref, b_ref = (np.concatenate([r[i] for r in runs]) for i in (1, 2))
    env = evaluate(qgraph, {"x": data[:, 0]}, keep_all=True)
    dq = next(n for n in qgraph.nodes if n.op == "Dequantize")
    want = np.concatenate([r[0] for r in runs])
    lsb = np.abs(np.rint((env["y"] - want) / dq.attrs["scale"]))
    same = (env[q.inputs[0]] == a_ref) & (env[q.inputs[1]] == b_ref)      # broadcast
    print(f"\n{name}: {int((lsb > 0).sum())} of {lsb.size} values differ, max {lsb.max()} "
          f"LSB; with equal inputs ({int(same.sum())}) max {lsb[same].max()} LSB")
    assert lsb[same].max() <= 1
    assert same.mean() > 0.99
