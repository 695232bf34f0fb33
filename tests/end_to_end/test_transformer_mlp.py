"""A vision transformer's MLP block (issue 38) with the scales a transformer has: x -> MatMul
-> Add bias -> GELU -> MatMul -> Add bias -> residual Add with x, node for node as torch.onnx
(opset 17) writes it for timm's DeiT, with timm's initialization (weights and biases of
standard deviation 0.02) and LayerNorm-like inputs (standard deviation 1, outliers of +-8 in
two channels).

GELU is written three ways: the Erf form exactly as the DeiT-tiny export has it (Div by
1.4142135381698608, Erf, Add 1.0, Mul by x, Mul by 0.5; every constant a float32 scalar
``Constant``), the tanh form as torch's ``gelu(approximate="tanh")`` symbolic writes it, and
the opset-20 ``Gelu`` node in both modes. Each is one table fused into the first layer's
post-processor, and the residual Add is a ``QEltwise`` sum on the element-wise engine.

The export reads ``x`` as ``[1, T, D]`` (T tokens): hwonnx views the block's tokens as the
pixels of an image ``[1, D, T, 1]`` (hwonnx/frontend/tokens.py), so each MatMul is a 1x1
convolution over the T tokens, GELU its table and the residual Add a sum on the engine, with
the views of ``x`` and ``y`` on the host. The tokens do not mix in this block, so its per-token
twin, the same nodes on ``[1, D]`` with the tokens as samples, computes the same function: the
tests below run both (``SHAPES``) against onnxruntime on the ``[1, T, D]`` export, and the
export's golden model equals the twin's token by token, bit for bit. The attention's MatMuls of
two computed tensors (Q K^T, softmax V) stay refused by name.

Bounds, per element, each for one stage on the values that stage reads (docs/arithmetic.md):

* against onnxruntime's reference path (a QDQ model with hwonnx's own scales, zero points and
  integer weights, no graph optimization): the two compute the same quantized arithmetic, and
  differ only where a requantized value lies within float32 error (or a half-up against
  half-to-even tie) of a rounding boundary, by one step there. So the layers' and the residual
  sum's int8 outputs are within 1 LSB; GELU's table then maps an index one step off to a value
  at most ``L s_h`` away (``L`` = 1.13, GELU's largest slope; ``s_h`` the table's input step),
  so its output is within ``floor(L s_h / s_g) + 1`` LSB;
* against the float model (onnxruntime on the ``[1, T, D]`` export, on the calibration tokens,
  whose min/max ranges cover every value): the GELU layer's output ``g`` is within
  ``s_g / 2 + L (s_h / 2 + |h_acc - h|)``, where ``h_acc`` is the exact value of the layer's
  int32 accumulator (its int8 input and weights) and ``h`` the float pre-activation: half a
  table input step through GELU's slope, half an output step; the second layer's output
  within ``s_f / 2 + |f_acc - f|``; the residual sum within
  ``s_y / 2 + 255 max(s_x, s_f) / 2**16 + |x_q - x| + |f_q - f|`` (its rounding, the engine's
  weights held to 2**-16 of the larger scale, and its inputs' errors). Each plus 1e-3 of a
  step for float32 (onnxruntime's sums, the 31-bit multipliers).
"""

import math
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import quiet
from hwonnx.api import build
from hwonnx.errors import UnsupportedOperatorError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.golden import evaluate
from hwonnx.ir.tables import TABLE_OPS
from ort_reference import reference_session
from rtl_helpers import rtl_matches_golden

F32 = np.float32
T, D = 16, 64
BLOCK = "/blocks/blocks.0"
MLP = f"{BLOCK}/mlp"
#: GELU forms: torch.onnx's Erf and tanh forms (opset 17), the opset-20 Gelu node's modes
FORMS = ("erf", "tanh", "gelu-none", "gelu-tanh")
#: GELU's largest slope (1.129 at x = sqrt 2, both forms)
L = TABLE_OPS["Gelu"].slope({"approximate": "none"})
#: float32 arithmetic (onnxruntime's sums, the multipliers' 2**-31) in steps of the output
SLACK = 1e-3
#: the block as exported (``x`` of [1, T, D]: 1x1 convolutions over the tokens) and its
#: per-token twin (``x`` of [1, D]: dense layers, a token per sample)
SHAPES = {"tokens": T, "per-token": None}


def _constant(name: str, value: float) -> onnx.NodeProto:
    """A float32 scalar ``Constant`` as torch.onnx writes one: node ``name``, value
    ``<name>_output_0``."""
    return helper.make_node("Constant", [], [f"{name}_output_0"], name=name,
                            value=numpy_helper.from_array(np.array(value, F32)))


def gelu_nodes(form: str, h: str, act: str) -> "tuple[list[onnx.NodeProto], str]":
    """The nodes of GELU on ``h`` (names under ``act``) and the value they write."""
    def node(op, inputs, index=""):
        return helper.make_node(op, inputs, [f"{act}/{op}{index}_output_0"],
                                name=f"{act}/{op}{index}")

    def out(op, index=""):
        return f"{act}/{op}{index}_output_0"

    if form == "erf":                           # the DeiT-tiny export's nodes
        return [_constant(f"{act}/Constant", 1.4142135381698608),
                node("Div", [h, out("Constant")]),
                node("Erf", [out("Div")]),
                _constant(f"{act}/Constant_1", 1.0),
                node("Add", [out("Erf"), out("Constant_1")]),
                node("Mul", [h, out("Add")]),
                _constant(f"{act}/Constant_2", 0.5),
                node("Mul", [out("Mul"), out("Constant_2")], "_1")], out("Mul", "_1")
    if form == "tanh":      # torch's symbolic: half * (x * (one + tanh(beta * (x + kappa x^3))))
        return [node("Mul", [h, h]),
                node("Mul", [h, out("Mul")], "_1"),
                _constant(f"{act}/Constant", 0.044715),
                node("Mul", [out("Constant"), out("Mul", "_1")], "_2"),
                node("Add", [h, out("Mul", "_2")]),
                _constant(f"{act}/Constant_1", math.sqrt(2 / math.pi)),
                node("Mul", [out("Constant_1"), out("Add")], "_3"),
                node("Tanh", [out("Mul", "_3")]),
                _constant(f"{act}/Constant_2", 1.0),
                node("Add", [out("Constant_2"), out("Tanh")], "_1"),
                node("Mul", [h, out("Add", "_1")], "_4"),
                _constant(f"{act}/Constant_3", 0.5),
                node("Mul", [out("Constant_3"), out("Mul", "_4")], "_5")], out("Mul", "_5")
    gelu = helper.make_node("Gelu", [h], [out("Gelu")], name=f"{act}/Gelu",
                            approximate=form.split("-")[1])
    return [gelu], out("Gelu")


def block_weights(seed: int = 38, dim: int = D) -> "dict[str, np.ndarray]":
    """timm's initialization of a ViT MLP: trunc_normal(std=0.02) weights (normal here: 4
    sigma never comes up), and small biases where timm's zeros would hide the bias path."""
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(0, 0.02, (dim, 4 * dim)), "b1": rng.normal(0, 0.02, 4 * dim),
            "w2": rng.normal(0, 0.02, (4 * dim, dim)), "b2": rng.normal(0, 0.02, dim)}


def mlp_block(form: str, tokens: "int | None" = T, dim: int = D) -> onnx.ModelProto:
    """The block as exported (``x`` of ``[1, tokens, dim]``), or its per-token twin
    (``tokens`` None: ``[1, dim]``, the same nodes and constants)."""
    h = f"{MLP}/fc1/Add_output_0"
    act, g = gelu_nodes(form, h, f"{MLP}/act")
    nodes = [helper.make_node("MatMul", ["x", "w1"], [f"{MLP}/fc1/MatMul_output_0"],
                              name=f"{MLP}/fc1/MatMul"),
             helper.make_node("Add", ["b1", f"{MLP}/fc1/MatMul_output_0"], [h],
                              name=f"{MLP}/fc1/Add"),
             *act,
             helper.make_node("MatMul", [g, "w2"], [f"{MLP}/fc2/MatMul_output_0"],
                              name=f"{MLP}/fc2/MatMul"),
             helper.make_node("Add", ["b2", f"{MLP}/fc2/MatMul_output_0"],
                              [f"{MLP}/fc2/Add_output_0"], name=f"{MLP}/fc2/Add"),
             helper.make_node("Add", ["x", f"{MLP}/fc2/Add_output_0"], ["y"],
                              name=f"{BLOCK}/Add_1")]
    shape = [1, dim] if tokens is None else [1, tokens, dim]
    graph = helper.make_graph(
        nodes, "main_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(v.astype(F32), k) for k, v in block_weights(dim=dim).items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 20 if form.startswith("gelu") else 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def token_rows(rng, count: int, dim: int = D) -> np.ndarray:
    """``count`` tokens as a LayerNorm writes them: standard normal, and in a quarter of them
    an outlier of +-8 in channel 5 (and -8 in channel 41 in half of those), as the outlier
    channels of a transformer's LayerNorm outputs."""
    x = rng.normal(0, 1, (count, dim)).astype(F32)
    rows = rng.choice(count, count // 4, replace=False)
    x[rows, 5] = 8 * rng.choice([-1, 1], rows.size)
    x[rows[::2], 41] = -8
    return x


#: the calibration tokens: 16 sequences of T tokens
CALIB = token_rows(np.random.default_rng(0), 16 * T)


def feeds(graph, x: np.ndarray) -> "dict[str, np.ndarray]":
    """The tokens ``x`` ([S, D]) as the block's ``graph`` (float or integer) reads them: a
    token per sample, or ``T`` per sample ([S / T, T, D])."""
    return {"x": x.reshape(-1, *graph.types["x"].shape[1:])}


def compiled(form: str, shape: str = "tokens"):
    model = mlp_block(form, tokens=SHAPES[shape])
    return build(model, None, calib=feeds(load_model(model), CALIB), verilog=False, log=quiet)


def stages(result):
    """The integer graph's layers and each value's (scale, zero point): ``x`` (input), ``h``
    (the GELU table's input: the first layer's own output parameters), ``g`` (GELU), ``f``
    (the second layer), ``y``."""
    quantize, fc1, fc2, add = [n for n in result.graph.nodes
                               if n.op in ("Quantize", "QDense", "QConv", "QEltwise")]
    layer = "QConv" if len(result.graph.types["x"].shape) == 3 else "QDense"
    assert [n.op for n in (quantize, fc1, fc2, add)] == ["Quantize", layer, layer, "QEltwise"]
    params = {"x": (quantize.attrs["scale"], quantize.attrs["zero_point"]),
              "h": (fc1.attrs["out_scale"], fc1.attrs["out_zp"]),
              "g": (fc2.attrs["in_scale"], fc2.attrs["in_zp"]),
              "f": (fc2.attrs["out_scale"], fc2.attrs["out_zp"]),
              "y": (add.attrs["out_scale"], add.attrs["out_zp"])}
    assert (add.attrs["a_scale"], add.attrs["za"]) == params["x"]
    assert (add.attrs["b_scale"], add.attrs["zb"]) == params["f"]
    return (fc1, fc2, add), params


def integer_weights(result, layer, name: str) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """The layer's int8 weights ``[K, M]``, its int32 bias and its weight scales, which are
    docs/arithmetic.md's ``max_k |w[k, n]| / 127`` of the float weights ``name``: checked by
    quantizing those again."""
    w = block_weights()[name].astype(F32).astype(np.float64)
    scale = np.abs(w).max(axis=0) / 127
    wq = result.graph.constants[layer.inputs[1]]
    if layer.op == "QConv":                                     # [M, K, 1, 1]
        wq = wq.reshape(len(wq), -1).T
    np.testing.assert_array_equal(wq, np.clip(np.rint(w / scale), -127, 127))
    return wq.astype(np.int64), result.graph.constants[layer.inputs[2]].astype(np.int64), scale


def as_rows(value: np.ndarray) -> np.ndarray:
    """A golden value as one row per token: ``[S, K]``, or ``[S, K, T, 1]`` images (the
    tokens as pixels) as ``[S T, K]``."""
    if value.ndim == 4:
        value = value[..., 0].transpose(0, 2, 1)
    return value.reshape(-1, value.shape[-1])


def golden_values(result, x: np.ndarray) -> "dict[str, np.ndarray]":
    """The golden model's int8 ``x``, ``g``, ``f``, ``y`` on the tokens ``x`` ([S, D]), a row
    per token."""
    (fc1, fc2, add), _ = stages(result)
    env = evaluate(result.graph, feeds(result.graph, x), keep_all=True)
    return {k: as_rows(env[v]).astype(np.int64)
            for k, v in (("x", fc1.inputs[0]), ("g", fc1.outputs[0]), ("f", fc2.outputs[0]),
                         ("y", add.outputs[0]))}


def _dq(q, params):
    scale, zp = params
    return (q - zp) * scale


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", FORMS)
def test_block_is_two_layers_with_a_gelu_table_and_a_residual_sum(form, shape):
    """The GELU nodes are one Gelu of the right mode, its table fused into the first layer
    (named after the pattern's last node); the residual Add a QEltwise sum on the engine.
    The export's MatMuls are 1x1 convolutions (the weight transposed, [4D, D, 1, 1]) over the
    image [1, D, T, 1] of the tokens, which the host makes of ``x`` and turns back into
    ``y``'s tokens."""
    model = mlp_block(form, tokens=SHAPES[shape])
    graph = load_model(model)
    gelu = next(n for n in graph.nodes if n.op == "Gelu")
    act = next(n.name for n in model.graph.node if n.output[0] == gelu.outputs[0])
    layer = "Conv" if shape == "tokens" else "Dense"
    ops = [(n.op, n.name) for n in graph.nodes]
    views = [(op, name) for op, name in ops if name.endswith("_view")]
    assert [x for x in ops if x not in views] == [
        (layer, f"{MLP}/fc1/MatMul"), ("Gelu", act), (layer, f"{MLP}/fc2/MatMul"),
        ("Add", f"{BLOCK}/Add_1")]
    mode = "tanh" if form.endswith("tanh") else "none"
    assert dict(gelu.attrs) == {"approximate": mode}
    if shape == "tokens":
        assert views == [("Reshape", "x_rows_view"), ("Transpose", "x_image_view"),
                         ("Transpose", "y_rows_view"), ("Reshape", "y_view")]
        assert {name: graph.meta["host_steps"][name]["at"] for _, name in views} == {
            "x_rows_view": "start", "x_image_view": "start", "y_rows_view": "end",
            "y_view": "end"}
        fc1 = graph.nodes[2]
        assert graph.types[fc1.inputs[0]].shape == (1, D, T, 1)
        assert (fc1.attrs["strides"], fc1.attrs["pads"], fc1.attrs["group"]) == (
            (1, 1), (0, 0, 0, 0), 1)
        np.testing.assert_array_equal(graph.constants[fc1.inputs[1]][:, :, 0, 0],
                                      block_weights()["w1"].astype(F32).T)
    else:
        assert views == []
    (fc1, fc2, add), _ = stages(compiled(form, shape))
    assert (fc1.attrs["activation"], fc1.attrs["table_node"], len(fc1.attrs["table"])) == (
        "Gelu", act, 256)
    assert "table" not in fc2.attrs
    assert (add.attrs["kind"], add.attrs["mode"], add.attrs["mul"]) == ("add", "sum", False)


@pytest.mark.parametrize("form", FORMS)
def test_token_block_is_its_per_token_twin_on_every_token(form):
    """The [1, T, D] export, calibrated on the same tokens as its per-token twin: the float
    graph computes the export's function (onnxruntime), and the integer graph is the twin's
    (the same int8 weights, int32 biases, scales and zero points, the same table), so its
    golden output equals the twin's on every token, bit for bit."""
    model = mlp_block(form)
    x = token_rows(np.random.default_rng(3), 4 * T)
    session = reference_session(model)
    want = np.concatenate([session.run(None, {"x": seq[None]})[0] for seq in
                           x.reshape(-1, T, D)])
    got = evaluate_float(load_model(model), {"x": x.reshape(-1, T, D)})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    tokens, twin = compiled(form, "tokens"), compiled(form, "per-token")
    layers = [stages(r)[0] for r in (tokens, twin)]
    for mine, theirs in zip(*layers):
        assert {k: v for k, v in mine.attrs.items() if k not in (
            "strides", "pads", "dilations", "group", "kernel")} == dict(theirs.attrs)
    for index, name in ((0, "w1"), (1, "w2")):
        for mine, theirs in zip(integer_weights(tokens, layers[0][index], name),
                                integer_weights(twin, layers[1][index], name)):
            np.testing.assert_array_equal(mine, theirs)
    mine, theirs = golden_values(tokens, x), golden_values(twin, x)
    for key in theirs:
        np.testing.assert_array_equal(mine[key], theirs[key])


def attention_scores() -> onnx.ModelProto:
    """The core of a DeiT attention head as torch.onnx writes it: q = x Wq and k = x Wk (token
    MatMuls by constants), then ``q k^T`` (MatMul of two computed tensors), Softmax, and the
    probabilities times v = x Wv (another)."""
    rng = np.random.default_rng(7)
    attn = f"{BLOCK}/attn"
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n], name=f"{attn}/{n}/MatMul")
             for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name=f"{attn}/Transpose_1",
                               perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"], name=f"{attn}/MatMul"),
              helper.make_node("Softmax", ["s"], ["p"], name=f"{attn}/Softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name=f"{attn}/MatMul_1")]
    graph = helper.make_graph(
        nodes, "main_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])],
        [numpy_helper.from_array(rng.normal(0, 0.02, (D, D)).astype(F32), f"w{n}")
         for n in "qkv"])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_attention_matmuls_of_two_computed_tensors_are_refused():
    """Attention's Q K^T and softmax-times-V multiply two tensors computed at run time: no
    mapping (the array holds one operand as constant weights), refused by name with why; the
    token MatMuls by constant weights around them pass."""
    attn = f"{BLOCK}/attn"
    message = (f"2 unsupported node(s): node '{attn}/MatMul' MatMul (domain 'ai.onnx', opset "
               f"17); node '{attn}/MatMul_1' MatMul (domain 'ai.onnx', opset 17) (MatMul "
               f"'{attn}/MatMul' needs a constant second operand, but 'kt' is computed at run "
               f"time; MatMul "
               f"'{attn}/MatMul_1' needs a constant second operand, but 'v' is computed at "
               f"run time); supported operators are ")
    with pytest.raises(UnsupportedOperatorError, match="^" + re.escape(message)):
        load_model(attention_scores())


def reference_stages(form: str, result) -> onnx.ModelProto:
    """onnxruntime's reference path of the compiled block, one stage per input, with hwonnx's
    own parameters: ``x`` -> Q/DQ -> MatMul (DQ int8 weights) -> Add (DQ int32 bias) -> Q/DQ
    (the table's input) -> the form's GELU nodes -> Q = ``g_q``; ``g_in`` (the golden ``g``,
    dequantized) -> Q/DQ -> MatMul -> Add -> Q = ``f_q``; ``f_in`` (the golden ``f``) -> Q/DQ,
    + DQ(Q(x)) -> Q = ``y_q``."""
    (fc1, fc2, _), params = stages(result)
    inits, nodes = {}, []

    def qdq(value, key, dq=True):
        scale, zp = params[key]
        inits[f"s_{key}"], inits[f"z_{key}"] = np.array(scale, F32), np.array(zp, np.int8)
        nodes.append(helper.make_node("QuantizeLinear", [value, f"s_{key}", f"z_{key}"],
                                      [f"{value}_q"]))
        if dq:
            nodes.append(helper.make_node("DequantizeLinear", [f"{value}_q", f"s_{key}",
                                                               f"z_{key}"], [f"{value}_dq"]))
        return f"{value}_dq"

    def layer(x, node, name, in_key, out):
        wq, bq, s_w = integer_weights(result, node, name)
        s_in = params[in_key][0]
        inits.update({f"{name}_q": wq.astype(np.int8), f"{name}_s": s_w.astype(F32),
                      f"{name}_z": np.zeros(len(s_w), np.int8),
                      f"{name}_b": bq.astype(np.int32),
                      f"{name}_bs": (F32(s_in) * s_w.astype(F32)).astype(F32),
                      f"{name}_bz": np.zeros(len(s_w), np.int32)})
        nodes.extend([
            helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                             [f"{name}_dq"], axis=1),
            helper.make_node("DequantizeLinear", [f"{name}_b", f"{name}_bs", f"{name}_bz"],
                             [f"{name}_bdq"], axis=0),
            helper.make_node("MatMul", [x, f"{name}_dq"], [f"{name}_mm"]),
            helper.make_node("Add", [f"{name}_bdq", f"{name}_mm"], [out])])

    x_dq = qdq("x", "x")
    layer(x_dq, fc1, "w1", "x", "h")
    act, g = gelu_nodes(form, qdq("h", "h"), "act")
    nodes.extend(act)
    nodes.append(helper.make_node("Identity", [g], ["g"]))
    qdq("g", "g", dq=False)
    layer(qdq("g_in", "g"), fc2, "w2", "g", "f")
    qdq("f", "f", dq=False)
    nodes.append(helper.make_node("Add", [x_dq, qdq("f_in", "f")], ["y"]))
    qdq("y", "y", dq=False)
    io = lambda name, size, kind=TensorProto.FLOAT: helper.make_tensor_value_info(  # noqa: E731
        name, kind, [1, size])
    graph = helper.make_graph(
        nodes, "reference", [io("x", D), io("g_in", 4 * D), io("f_in", D)],
        [io(f"{v}_q", n, TensorProto.INT8) for v, n in (("x", D), ("g", 4 * D), ("f", D),
                                                        ("y", D))],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", FORMS)
def test_golden_within_one_rounding_of_onnxruntimes_reference_path(form, shape):
    """On new tokens, each stage of the golden model against onnxruntime's reference path on
    the golden model's own int8 inputs of that stage: the input equal, GELU within
    ``floor(L s_h / s_g) + 1`` LSB, the second layer and the residual sum within 1 LSB
    (module docstring)."""
    result = compiled(form, shape)
    _, params = stages(result)
    x = token_rows(np.random.default_rng(1), 8 * T)
    golden = golden_values(result, x)
    session = reference_session(reference_stages(form, result))
    want = {k: [] for k in ("x", "g", "f", "y")}
    for row, g, f in zip(x, golden["g"], golden["f"]):
        stage_inputs = {"x": row[None], "g_in": _dq(g, params["g"]).astype(F32)[None],
                        "f_in": _dq(f, params["f"]).astype(F32)[None]}
        for key, value in zip(want, session.run(None, stage_inputs)):
            want[key].append(value[0].astype(np.int64))
    bounds = {"x": 0, "g": math.floor(L * params["h"][0] / params["g"][0]) + 1, "f": 1, "y": 1}
    report = []
    for key, bound in bounds.items():
        diff = np.abs(golden[key] - np.array(want[key]))
        report.append(f"{key} {diff.max()} LSB (bound {bound}, {np.count_nonzero(diff)} of "
                      f"{diff.size} differ)")
        assert diff.max() <= bound, report[-1]
    print(f"\n{form} {shape}: golden - onnxruntime's reference path: " + "; ".join(report))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", FORMS)
def test_golden_within_each_stages_rounding_of_the_float_model(form, shape):
    """On the calibration tokens (their ranges cover every value), the golden model against
    onnxruntime on the float ``[1, T, D]`` export, stage by stage within the bounds of the
    module docstring; the per-token twin computes the export's function."""
    result = compiled(form, shape)
    (fc1, fc2, _), params = stages(result)
    export = mlp_block(form)
    for value in (f"{MLP}/fc1/Add_output_0", fc2.inputs[0].removesuffix(":q"),
                  f"{MLP}/fc2/Add_output_0"):
        export.graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT,
                                                                 None))
    session = reference_session(export)
    runs = [session.run(None, {"x": seq[None]}) for seq in CALIB.reshape(-1, T, D)]
    y, h, g, f = (np.concatenate([r[i][0] for r in runs]).astype(np.float64)
                  for i in range(4))
    twin = reference_session(mlp_block(form, tokens=None))
    np.testing.assert_allclose(np.concatenate([twin.run(None, {"x": r[None]})[0]
                                               for r in CALIB]), y, rtol=1e-5, atol=1e-6)

    q = golden_values(result, CALIB)
    got = {k: _dq(q[k], params[k]) for k in q}
    (s_x, _), (s_h, _), (s_g, z_g), (s_f, _), (s_y, _) = (params[k] for k in "xhgfy")
    w1, b1, s_w1 = integer_weights(result, fc1, "w1")
    w2, b2, s_w2 = integer_weights(result, fc2, "w2")
    h_acc = ((q["x"] - params["x"][1]) @ w1 + b1) * (s_x * s_w1)
    f_acc = ((q["g"] - z_g) @ w2 + b2) * (s_g * s_w2)
    x = CALIB.astype(np.float64)
    errors = {"x": np.abs(got["x"] - x), "g": np.abs(got["g"] - g),
              "f": np.abs(got["f"] - f), "y": np.abs(got["y"] - y)}
    bounds = {"x": np.full_like(x, s_x / 2),
              "g": s_g / 2 + L * (s_h / 2 + np.abs(h_acc - h)),
              "f": s_f / 2 + np.abs(f_acc - f),
              "y": s_y / 2 + 255 * max(s_x, s_f) / 2 ** 16 + errors["x"] + errors["f"]}
    report = []
    for key, bound in bounds.items():
        step = params[key][0]
        report.append(f"{key} {errors[key].max() / step:.3f} LSB (bound {bound.max() / step:.3f}"
                      f" LSB at most; error/bound {(errors[key] / bound).max():.2f} at most)")
        assert np.all(errors[key] <= bound + SLACK * step), report[-1]
    branch = y - x
    print(f"\n{form} {shape}: golden - float model: " + "; ".join(report) + f"; the MLP "
          f"branch y - x: std {branch.std() / s_y:.2f} LSB of y, its golden value off by "
          f"{np.abs(got['y'] - got['x'] - branch).max() / s_y:.2f} LSB at most")


@pytest.mark.rtl
@pytest.mark.parametrize("shape", SHAPES)
def test_block_on_rtl(tmp_path, shape):
    """The Erf form on the 8x8 RTL, 2 T tokens: ``T`` per sample (the export: two samples),
    or one (its twin: the first four tokens); every layer equal to golden bit for bit, every
    sample in the predicted cycles."""
    model = mlp_block("erf", tokens=SHAPES[shape])
    result = build(model, tmp_path / "build", calib=feeds(load_model(model), CALIB), log=quiet)
    count = 2 * T if shape == "tokens" else 4
    x = feeds(result.graph, token_rows(np.random.default_rng(2), count))
    rtl = rtl_matches_golden(result, x, len(x["x"]))
    per = T if shape == "tokens" else 1
    print(f"\nRTL, {shape}: {rtl.cycles[0]} cycles per sample of {per} token(s) (predicted "
          f"{rtl.predicted_cycles}), {rtl.cycles[0] / per:.0f} per token")
