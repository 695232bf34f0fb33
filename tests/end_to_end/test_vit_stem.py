"""A vision transformer's stem and head (issue 38), node for node as torch.onnx (opset 17)
writes them in timm's DeiT-tiny export: the patch embedding (a Conv of kernel = stride = the
patch, ``Shape -> Slice -> Concat -> Reshape`` to [1, D, N], ``Transpose`` perm [0, 2, 1] to
the tokens [1, N, D]), the class token (the [1, 1, D] initializer through ``ConstantOfShape ->
Mul -> Equal -> Where -> Expand``, folded) joined before them (``Concat`` axis 1), the
position embedding (``Add`` of [1, N + 1, D]), a block's MLP half (``LayerNormalization``,
fc1, GELU's Erf form, fc2, the residual ``Add``), the final ``LayerNormalization``, the class
token picked (``Gather`` of the int64 scalar 0 on axis 1) and the head (``Gemm`` transB 1).
Small: 16x16 images, 4x4 patches (N = 16), D = 16, 10 classes; weights of timm's scale.

Two forms: ``deit`` as above; ``plain`` without class token, position embedding and
LayerNorms (the MLP reads the patch tokens, the head picks token 0), which runs on the array
in one program. The token view (hwonnx/frontend/tokens.py) makes of them:

* the patch tokens: the image [1, D, N, 1], which is the Conv's output [1, D, h, w] relabelled
  (the same pixels in the same order): one Reshape, a free view (the compiler lays out both
  alike, ``layout_view``), no Transpose, no copy;
* the class token's Concat: a Concat along the image's height of the constant [1, D, 1, 1]
  and the patch image, which the host runs (the array reads no constant image) beside the
  position embedding's Add, a host step too (a per-token constant): one round trip;
* the Gather: row 0 of the image; on the array a ``QSlice`` copy (``plain``), on the host
  where it reads the host's LayerNorm (``deit``: the host then writes the last segment the
  class token [1, D] only).

Bounds, per element, each for one stage on the values that stage reads (as in
tests/end_to_end/test_transformer_mlp.py; ``s_v`` is value v's scale):

* against onnxruntime's reference path: onnxruntime's per-channel QDQ quantization of the
  plain stem and head with one token MatMul (no GELU: onnxruntime puts a QDQ pair between
  each of its nodes), built with its own parameters: within 1 LSB of its reference path
  (the same quantized arithmetic, one step apart only where a value lies within float32
  error of a rounding boundary);
* against the float model (onnxruntime on the export, on the calibration images, whose ranges
  cover every value): the patch Conv ``c`` within ``s_c / 2 + |c_acc - c|`` (``c_acc`` the
  exact value of its int32 accumulator from the golden int8 input); the host's class token
  and position embedding ``x = concat(cls, c) + pos`` within ``s_x / 2 + |c_q - c|`` (the
  class token's row ``s_x / 2``); a host LayerNorm's int8 result within ``s / 2`` of
  onnxruntime's LayerNormalization on the golden model's own float input of it (the host's
  float32 value, which the stage reads); GELU ``g`` within ``s_g / 2 + L (s_h / 2 + |h_acc -
  h|)`` (L = 1.13, GELU's largest slope); fc2 ``f`` within ``s_f / 2 + |f_acc - f|``; the
  residual sum ``y`` within ``s_y / 2 + 255 max(s_x, s_f) / 2**16 + |x_q - x| + |f_q - f|``;
  the picked class token equal to row 0 of its input, bit for bit (a copy); the logits
  within ``s_o / 2 + |o_acc - o|``. Each plus 1e-3 of a step for float32.
"""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from helpers import quiet
from hwonnx.api import build, first_difference, simulate
from hwonnx.compiler.timing import predict
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate
from hwonnx.ir.evaluate import evaluate_float
from ort_reference import reference_outputs, reference_session
from tests.end_to_end.test_transformer_mlp import L, gelu_nodes
from tests.frontend.test_fold_exporters import class_token_nodes, const

F32 = np.float32
SIZE, PATCH, D, CLASSES = 16, 4, 16, 10
N = (SIZE // PATCH) ** 2
FORMS = ("deit", "plain")
PE, BLOCK, MLP = "/patch_embed", "/blocks/blocks.0", "/blocks/blocks.0/mlp"
CONV, TOKENS = f"{PE}/proj/Conv_output_0", f"{PE}/Transpose_output_0"
#: float32 arithmetic in steps of the output
SLACK = 1e-3


def _node(op, inputs, output, name, **attrs):
    return helper.make_node(op, inputs, [output], name=name, **attrs)


def _layernorm(x: str, out: str, name: str, prefix: str) -> onnx.NodeProto:
    return _node("LayerNormalization", [x, f"{prefix}.weight", f"{prefix}.bias"], out, name,
                 axis=-1, epsilon=9.999999974752427e-07)


def patch_embedding() -> "list[onnx.NodeProto]":
    """The DeiT export's patch embedding, to the tokens ``TOKENS`` [1, N, D]."""
    return [
        _node("Conv", ["input", "patch_embed.proj.weight", "patch_embed.proj.bias"], CONV,
              f"{PE}/proj/Conv", dilations=[1, 1], group=1, kernel_shape=[PATCH, PATCH],
              pads=[0, 0, 0, 0], strides=[PATCH, PATCH]),
        _node("Shape", [CONV], f"{PE}/Shape_output_0", f"{PE}/Shape"),
        const(f"{PE}/Constant", np.array([0], np.int64)),
        const(f"{PE}/Constant_1", np.array([0], np.int64)),
        const(f"{PE}/Constant_2", np.array([2], np.int64)),
        _node("Slice", [f"{PE}/Shape_output_0", f"{PE}/Constant_1_output_0",
                        f"{PE}/Constant_2_output_0", f"{PE}/Constant_output_0"],
              f"{PE}/Slice_output_0", f"{PE}/Slice"),
        const(f"{PE}/Constant_3", np.array([-1], np.int64)),
        _node("Concat", [f"{PE}/Slice_output_0", f"{PE}/Constant_3_output_0"],
              f"{PE}/Concat_output_0", f"{PE}/Concat", axis=0),
        _node("Reshape", [CONV, f"{PE}/Concat_output_0"], f"{PE}/Reshape_output_0",
              f"{PE}/Reshape", allowzero=0),
        _node("Transpose", [f"{PE}/Reshape_output_0"], TOKENS, f"{PE}/Transpose",
              perm=[0, 2, 1])]


def head(tokens: str, weight: str = "head.weight") -> "list[onnx.NodeProto]":
    """The class token ``x[:, 0]`` as the export picks it, and the head."""
    return [const("/Constant", np.array(0, np.int64)),
            _node("Gather", [tokens, "/Constant_output_0"], "/Gather_output_0", "/Gather",
                  axis=1),
            _node("Gemm", ["/Gather_output_0", weight, "head.bias"], "logits", "/head/Gemm",
                  alpha=1.0, beta=1.0, transB=1)]


def weights(seed: int = 38) -> "dict[str, np.ndarray]":
    """timm's scales: trunc_normal(std=0.02) linear weights and the class token and position
    embedding; the patch projection and the MLP a few times larger so that the 16 channels
    of this small model carry values of a trained one's range; LayerNorm weights near 1."""
    rng = np.random.default_rng(seed)
    return {"patch_embed.proj.weight": rng.normal(0, 0.08, (D, 3, PATCH, PATCH)),
            "patch_embed.proj.bias": rng.normal(0, 0.02, D),
            "cls_token": rng.normal(0, 0.02, (1, 1, D)),
            "pos_embed": rng.normal(0, 0.02, (1, N + 1, D)),
            "blocks.0.norm2.weight": 1 + rng.normal(0, 0.1, D),
            "blocks.0.norm2.bias": rng.normal(0, 0.1, D),
            "onnx::MatMul_1": rng.normal(0, 0.16, (D, 4 * D)),
            "blocks.0.mlp.fc1.bias": rng.normal(0, 0.02, 4 * D),
            "onnx::MatMul_2": rng.normal(0, 0.08, (4 * D, D)),
            "blocks.0.mlp.fc2.bias": rng.normal(0, 0.02, D),
            "norm.weight": 1 + rng.normal(0, 0.1, D), "norm.bias": rng.normal(0, 0.1, D),
            "head.weight": rng.normal(0, 0.16, (CLASSES, D)),
            "head.bias": rng.normal(0, 0.02, CLASSES)}


def _model(nodes, inits) -> onnx.ModelProto:
    used = {v for n in nodes for v in n.input}
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
        [numpy_helper.from_array(np.asarray(v, F32), k) for k, v in inits.items() if k in used])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def vit(form: str) -> onnx.ModelProto:
    """The stem, an MLP half-block and the head (module docstring), ``deit`` or ``plain``."""
    deit = form == "deit"
    nodes = patch_embedding()
    x = "/Add_output_0" if deit else TOKENS
    if deit:
        nodes += class_token_nodes(TOKENS, x, D)
    h = f"{BLOCK}/norm2/LayerNormalization_output_0" if deit else x
    if deit:
        nodes.append(_layernorm(x, h, f"{BLOCK}/norm2/LayerNormalization", "blocks.0.norm2"))
    act, g = gelu_nodes("erf", f"{MLP}/fc1/Add_output_0", f"{MLP}/act")
    nodes += [_node("MatMul", [h, "onnx::MatMul_1"], f"{MLP}/fc1/MatMul_output_0",
                    f"{MLP}/fc1/MatMul"),
              _node("Add", ["blocks.0.mlp.fc1.bias", f"{MLP}/fc1/MatMul_output_0"],
                    f"{MLP}/fc1/Add_output_0", f"{MLP}/fc1/Add"),
              *act,
              _node("MatMul", [g, "onnx::MatMul_2"], f"{MLP}/fc2/MatMul_output_0",
                    f"{MLP}/fc2/MatMul"),
              _node("Add", ["blocks.0.mlp.fc2.bias", f"{MLP}/fc2/MatMul_output_0"],
                    f"{MLP}/fc2/Add_output_0", f"{MLP}/fc2/Add"),
              _node("Add", [x, f"{MLP}/fc2/Add_output_0"], f"{BLOCK}/Add_1_output_0",
                    f"{BLOCK}/Add_1")]
    y = "/norm/LayerNormalization_output_0" if deit else f"{BLOCK}/Add_1_output_0"
    if deit:
        nodes.append(_layernorm(f"{BLOCK}/Add_1_output_0", y, "/norm/LayerNormalization",
                                "norm"))
    return _model(nodes + head(y), weights())


def images(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (count, 3, SIZE, SIZE)).astype(F32)


CALIB = images(0, 32)


def _onnxruntime(model, x, extra=()) -> "list[np.ndarray]":
    """onnxruntime on the float ``model`` (and the values ``extra`` as outputs), an image at a
    time."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for value in extra:
        probe.graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))
    session = reference_session(probe)
    runs = [session.run(None, {"input": sample[None]}) for sample in x]
    return [np.concatenate([run[i] for run in runs]) for i in range(len(runs[0]))]


def compiled(form: str, folder=None):
    return build(vit(form), folder, calib={"input": CALIB}, verilog=folder is not None,
                 log=quiet)


@pytest.mark.parametrize("form", FORMS)
def test_float_graph_computes_the_export(form):
    """The float graph computes the export's function; the patch tokens are the Conv's output
    relabelled by one Reshape (no Transpose left), the MatMuls 1x1 Convs on [1, D, T, 1]."""
    model = vit(form)
    graph = load_model(model)
    x = images(1, 8)
    np.testing.assert_allclose(evaluate_float(graph, {"input": x})["logits"],
                               _onnxruntime(model, x)[0], rtol=1e-5, atol=1e-5)
    view = next(n for n in graph.nodes if n.name == f"{TOKENS}_image_view")
    assert (view.op, view.inputs[0], graph.types[view.outputs[0]].shape) == (
        "Reshape", CONV, (1, D, N, 1))
    assert graph.types[CONV].shape == (1, D, SIZE // PATCH, SIZE // PATCH)
    assert [n.name for n in graph.nodes if n.name.startswith(PE)] == [
        f"{PE}/proj/Conv", f"{TOKENS}_image_view"]
    assert "Permute" not in [n.op for n in graph.nodes]
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert [graph.types[n.inputs[0]].shape for n in convs] == [
        (1, 3, SIZE, SIZE), (1, D, N + (form == "deit"), 1), (1, 4 * D, N + (form == "deit"), 1)]


def test_deit_class_token_position_embedding_and_pick_run_on_the_host():
    """The class token's Concat joins a constant: a host step, with the position embedding's
    Add and the LayerNorm after it (one round trip); the final LayerNorm, its views, the pick
    of the class token and its Reshape run on the host, which writes the head's segment the
    class token [1, D] only. Three segments: the patch Conv, the MLP, the head."""
    result = compiled("deit")
    steps = result.graph.meta["host_steps"]
    assert steps["/Concat"] == {"at": "middle", "why": (
        "Concat joins the constant '/Expand_output_0' to the tokens (along the height of the "
        "image [1, 16, 17, 1]); the array reads no constant image; between accelerator "
        "segments: the host reads its input back and writes its result, quantized, into the "
        "next segment")}
    assert steps[f"{TOKENS}_image_view"]["why"].startswith(
        "Reshape views [1, 16, 4, 4] as the pixels of an image [1, 16, 16, 1], which the "
        "array reads (the tokens [1, 16, 16] are its transpose: the same data, in the same "
        "order) (only host steps read it)")
    assert steps["/Gather"]["why"].startswith(
        "Gather picks the tokens [0], rows of the image [1, 16, 17, 1] (it reads the host "
        "value '/norm/LayerNormalization_output_0_image')")
    for name in ("/Add", "/Gather_output_0_view", "/norm/LayerNormalization"):
        assert steps[name]["at"] == "middle"
    segments = result.graph.meta["segments"]
    assert [s["nodes"] for s in segments] == [
        [f"{PE}/proj/Conv"],
        [f"{MLP}/fc1/MatMul", f"{MLP}/fc2/MatMul", f"{BLOCK}/Add_1"], ["/head/Gemm"]]
    assert [[i[0] for i in s["inputs"]] for s in segments] == [
        ["input"], [f"{BLOCK}/norm2/LayerNormalization_output_0_image", "/Add_output_0_image"],
        ["/Gather_output_0"]]
    assert [[o[1] for o in s["outputs"]] for s in segments] == [
        [CONV], [f"{BLOCK}/Add_1_output_0_image"], ["logits"]]
    assert result.graph.types["/Gather_output_0"].shape == (1, D)


def test_plain_stem_and_head_are_one_program_on_the_array():
    """No host step: the MLP's first layer reads the patch Conv's output words as the image
    [1, D, N, 1] (the same base, a natural layout: no copy), and the pick of token 0 is a
    copy of the residual sum's first pixel."""
    result = compiled("plain")
    assert "host_steps" not in result.graph.meta
    assert [n.op for n in result.graph.nodes] == [
        "Quantize", "QConv", "Reshape", "QConv", "QConv", "QEltwise", "QSlice", "Reshape",
        "QDense", "Dequantize"]
    (program,) = result.programs
    places = program.placements
    conv, view = places[f"{CONV}:q"], places[f"{TOKENS}_image:q"]
    assert (conv.height, conv.width, conv.shape) == (4, 4, (1, D, 4, 4))
    assert (view.base, view.height, view.width, view.cb, view.shape) == (
        conv.base, N, 1, conv.cb, (1, D, N, 1))
    assert view.is_natural_image(8)
    pick = next(n for n in result.graph.nodes if n.op == "QSlice")
    assert (pick.attrs["starts"], result.graph.types[pick.outputs[0]].shape) == (
        (0, 0, 0), (1, D, 1, 1))
    assert [layer.name for layer in program.layers] == [
        f"{PE}/proj/Conv", f"{MLP}/fc1/MatMul", f"{MLP}/fc2/MatMul", f"{BLOCK}/Add_1",
        "/Gather", "/head/Gemm"]


def _dq(q, params):
    return (np.asarray(q, np.float64) - params[1]) * params[0]


def _weights(result, layer, name: str):
    """The layer's int8 weights as ``[K, M]`` (a Conv's taps in C, KH, KW order), its int32
    bias and its weight scales, docs/arithmetic.md's ``max |w| / 127`` per output channel of
    the float weights ``name`` (checked by quantizing those again)."""
    w = np.asarray(weights()[name], F32).astype(np.float64)
    w = w.reshape(len(w), -1).T if w.ndim == 4 else (w.T if name == "head.weight" else w)
    scale = np.abs(w).max(axis=0) / 127
    wq = result.graph.constants[layer.inputs[1]]
    wq = wq.reshape(len(wq), -1).T if wq.ndim == 4 else wq
    np.testing.assert_array_equal(wq, np.clip(np.rint(w / scale), -127, 127))
    return wq.astype(np.int64), result.graph.constants[layer.inputs[2]].astype(np.int64), scale


def _rows(value: np.ndarray) -> np.ndarray:
    """[S, K, T, 1] images (or [S, K] vectors) as a row per token, [S, T, K]."""
    value = np.asarray(value)
    return value[..., 0].transpose(0, 2, 1) if value.ndim == 4 else value[:, None]


def _patches(x: np.ndarray) -> np.ndarray:
    """The patch Conv's windows of ``x`` [S, 3, H, W], [S, N, 3 P P] (C, KH, KW order)."""
    s, p, n = len(x), PATCH, SIZE // PATCH
    return x.reshape(s, 3, n, p, n, p).transpose(0, 2, 4, 1, 3, 5).reshape(s, n * n, -1)


def _ort_layernorm(x: np.ndarray, prefix: str) -> np.ndarray:
    """onnxruntime's LayerNormalization of the rows ``x`` with the block's parameters."""
    inits = {k: weights()[k] for k in (f"{prefix}.weight", f"{prefix}.bias")}
    graph = helper.make_graph(
        [_layernorm("x", "y", "ln", prefix)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, D])],
        [numpy_helper.from_array(np.asarray(v, F32), k) for k, v in inits.items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    flat = np.asarray(x, F32).reshape(-1, D)
    return reference_session(model).run(None, {"x": flat})[0].reshape(np.shape(x))


@pytest.mark.parametrize("form", FORMS)
def test_golden_within_each_stages_rounding_of_the_float_model(form):
    """On the calibration images, each stage of the golden model against onnxruntime on the
    float export, within the bounds of the module docstring."""
    deit = form == "deit"
    result = compiled(form)
    graph = result.graph
    q = {n.name: n for n in graph.nodes}
    conv, fc1, fc2, add = (q[name] for name in (f"{PE}/proj/Conv", f"{MLP}/fc1/MatMul",
                                                f"{MLP}/fc2/MatMul", f"{BLOCK}/Add_1"))
    gemm = q["/head/Gemm"]
    params = {"in": (conv.attrs["in_scale"], conv.attrs["in_zp"]),
              "c": (conv.attrs["out_scale"], conv.attrs["out_zp"]),
              "n": (fc1.attrs["in_scale"], fc1.attrs["in_zp"]),
              "h": (fc1.attrs["out_scale"], fc1.attrs["out_zp"]),
              "g": (fc2.attrs["in_scale"], fc2.attrs["in_zp"]),
              "f": (fc2.attrs["out_scale"], fc2.attrs["out_zp"]),
              "x": (add.attrs["a_scale"], add.attrs["za"]),
              "y": (add.attrs["out_scale"], add.attrs["out_zp"]),
              "t": (gemm.attrs["in_scale"], gemm.attrs["in_zp"]),
              "o": (gemm.attrs["out_scale"], gemm.attrs["out_zp"])}
    assert (add.attrs["b_scale"], add.attrs["zb"]) == params["f"]
    env = evaluate(graph, {"input": CALIB}, keep_all=True)
    gold = {"in": env[conv.inputs[0]], "c": env[conv.outputs[0]], "n": _rows(env[fc1.inputs[0]]),
            "g": _rows(env[fc1.outputs[0]]), "f": _rows(env[fc2.outputs[0]]),
            "x": _rows(env[add.inputs[0]]), "y": _rows(env[add.outputs[0]]),
            "t": env[gemm.inputs[0]], "o": env[gemm.outputs[0]]}
    gold = {k: np.asarray(v, np.int64) for k, v in gold.items()}
    got = {k: _dq(v, params[k]) for k, v in gold.items()}
    last = "/norm/LayerNormalization_output_0" if deit else f"{BLOCK}/Add_1_output_0"
    extra = [CONV, f"{MLP}/fc1/Add_output_0", f"{MLP}/act/Mul_1_output_0",
             f"{MLP}/fc2/Add_output_0", f"{BLOCK}/Add_1_output_0"]
    if deit:
        extra += [last, "/Add_output_0", f"{BLOCK}/norm2/LayerNormalization_output_0"]
    floats = dict(zip(["o", "c", "h", "g", "f", "y", "last", "x", "n"],
                      (v.astype(np.float64) for v in _onnxruntime(vit(form), CALIB, extra))))
    if not deit:
        floats["x"] = floats["n"] = floats["c"].reshape(len(CALIB), D, N).transpose(0, 2, 1)
        floats["last"] = floats["y"]
    floats["t"] = floats["last"][:, 0]

    def acc(layer, source, name, rows):
        w, b, s_w = _weights(result, layer, name)
        return ((rows - params[source][1]) @ w + b) * (params[source][0] * s_w)

    c_rows = gold["c"].reshape(len(CALIB), D, N).transpose(0, 2, 1)
    c_acc = acc(conv, "in", "patch_embed.proj.weight", _patches(gold["in"]))
    c_float = floats["c"].reshape(len(CALIB), D, N).transpose(0, 2, 1)
    errors = {k: np.abs(got[k] - floats[k]) for k in ("g", "f", "y", "t", "o")}
    errors["c"] = np.abs(_dq(c_rows, params["c"]) - c_float)
    bounds = {"c": params["c"][0] / 2 + np.abs(c_acc - c_float),
              "g": params["g"][0] / 2 + L * (params["h"][0] / 2 + np.abs(
                  acc(fc1, "n", "onnx::MatMul_1", gold["n"]) - floats["h"])),
              "f": params["f"][0] / 2 + np.abs(acc(fc2, "g", "onnx::MatMul_2", gold["g"])
                                               - floats["f"])}
    if deit:
        # the host's float32 value: the class token and position embedding on the golden
        # Conv output; its LayerNorm, and the final one on the golden residual sum
        w = weights()
        host = np.concatenate([np.broadcast_to(w["cls_token"], (len(CALIB), 1, D)),
                               _dq(c_rows, params["c"])], axis=1) + w["pos_embed"]
        errors["x"] = np.abs(got["x"] - floats["x"])
        bounds["x"] = params["x"][0] / 2 + np.concatenate(
            [np.zeros((len(CALIB), 1, D)), errors["c"]], axis=1)
        errors["n"] = np.abs(got["n"] - _ort_layernorm(host, "blocks.0.norm2"))
        bounds["n"] = np.full_like(errors["n"], params["n"][0] / 2)
        picked = _ort_layernorm(got["y"], "norm")[:, 0]
        errors["t"] = np.abs(got["t"] - picked)
        bounds["t"] = np.full_like(picked, params["t"][0] / 2)
    else:                       # a copy of the residual sum's first pixel: bit for bit
        np.testing.assert_array_equal(gold["t"], gold["y"][:, 0])
        np.testing.assert_array_equal(gold["x"], c_rows)        # the view: the Conv's words
        errors["x"] = errors["c"]
    bounds["y"] = params["y"][0] / 2 + 255 * max(params["x"][0], params["f"][0]) / 2 ** 16 \
        + errors["x"] + errors["f"]
    if not deit:                # the copy adds nothing to the residual sum's error
        bounds["t"] = bounds["y"][:, 0]
    bounds["o"] = params["o"][0] / 2 + np.abs(acc(gemm, "t", "head.weight", gold["t"])
                                              - floats["o"])
    report = []
    for key in ("c", "x", "n", "g", "f", "y", "t", "o"):
        if key not in bounds:
            continue
        step = params[key][0]
        error, bound = errors[key], bounds[key]
        report.append(f"{key} {error.max() / step:.3f} LSB (bound {bound.max() / step:.3f} "
                      f"LSB at most; error/bound {(error / np.maximum(bound, 1e-30)).max():.3f}"
                      f" at most)")
        assert np.all(error <= bound + SLACK * step), report[-1]
    print(f"\n{form}: golden - float model: " + "; ".join(report))


class _Reader(CalibrationDataReader):
    def __init__(self, x):
        self.data = iter([{"input": sample[None]} for sample in x])

    def get_next(self):
        return next(self.data, None)


def matmul_stem() -> onnx.ModelProto:
    """The plain stem and head with one token MatMul (no bias: the import of pre-quantized
    models makes a bias Add a [1, K]-only Gemm) between the patch tokens and the pick."""
    nodes = patch_embedding() + [_node("MatMul", [TOKENS, "onnx::MatMul_1"], "/fc/MatMul_output_0",
                                       "/fc/MatMul")] + head("/fc/MatMul_output_0")
    rng = np.random.default_rng(5)
    return _model(nodes, {**weights(), "onnx::MatMul_1": rng.normal(0, 0.2, (D, D))})


def test_quantized_stem_and_head_match_the_reference(tmp_path):
    """onnxruntime's per-channel QDQ quantization of the plain stem and head (it puts a QDQ
    pair after the Reshape, the Transpose and the Gather too, with their input's parameters),
    built with its own parameters: the patch view, the token MatMul and the pick on the array,
    within 1 LSB of its reference path (module docstring)."""
    path, quantized = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(matmul_stem(), path)
    quantize_static(str(path), str(quantized), _Reader(CALIB), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    model = onnx.load(quantized)
    result = build(model, None, calib=None, verilog=False, log=quiet)
    assert [n.op for n in result.graph.nodes] == [
        "Quantize", "QConv", "Reshape", "QConv", "QSlice", "Reshape", "QDense", "Dequantize"]
    assert "3 weight(s)" in next(n for n in result.graph.meta["notes"]
                                 if n.startswith("Quantization parameters imported"))
    x = images(8, 16)
    golden = simulate(result, {"input": x}, mode="golden").outputs["logits"]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    lsb = np.abs(golden - reference_outputs(model, {"input": x})[0]) / float(inits[last.input[1]])
    print(f"\nQDQ stem and head vs its reference: {np.count_nonzero(lsb > 0.5)} of {lsb.size} "
          f"differ, largest {lsb.max():.2f} LSB")
    assert lsb.max() <= 1 + SLACK


def test_the_deit_tiny_exports_stem_and_head_nodes_are_these():
    """The reproducer's stem and head are the DeiT-tiny export's (timm, torch.onnx opset 17)
    node for node: op types, attributes and the constants' dtypes, as copied from it."""
    model = vit("deit")
    nodes = [n for n in model.graph.node if not n.name.startswith("/blocks/")]
    assert [(n.op_type, n.name) for n in nodes if n.op_type != "Constant"] == [
        ("Conv", f"{PE}/proj/Conv"), ("Shape", f"{PE}/Shape"), ("Slice", f"{PE}/Slice"),
        ("Concat", f"{PE}/Concat"), ("Reshape", f"{PE}/Reshape"),
        ("Transpose", f"{PE}/Transpose"), ("ConstantOfShape", "/ConstantOfShape"),
        ("Mul", "/Mul"), ("Equal", "/Equal"), ("Where", "/Where"), ("Expand", "/Expand"),
        ("Concat", "/Concat"), ("Add", "/Add"), ("LayerNormalization", "/norm/LayerNormalization"),
        ("Gather", "/Gather"), ("Gemm", "/head/Gemm")]
    gather = next(n for n in nodes if n.op_type == "Gather")
    index = next(n for n in nodes if n.output[0] == gather.input[1])
    value = numpy_helper.to_array(index.attribute[0].t)
    assert (value.dtype, value.shape, int(value)) == (np.int64, (), 0)
    assert [(a.name, helper.get_attribute_value(a)) for a in gather.attribute] == [("axis", 1)]


@pytest.mark.rtl
@pytest.mark.parametrize("form", FORMS)
def test_stem_and_head_on_rtl(tmp_path, form):
    """On the 8x8 RTL: every int8 value the host reads back (each segment's) and the logits
    equal to golden, bit for bit, every segment in its predicted cycles in every sample, every
    layer of every segment equal to golden (truncated programs)."""
    result = compiled(form, tmp_path / "build")
    x = {"input": images(2, 3)}
    rtl = simulate(result, x, mode="compare", log=quiet)
    golden = simulate(result, x, mode="golden")
    for value, want in golden.int_values.items():
        np.testing.assert_array_equal(rtl.int_values[value], want)
    np.testing.assert_array_equal(rtl.outputs["logits"], golden.outputs["logits"])
    predicted = [predict(p.expanded(), p.config).total for p in result.programs]
    assert (rtl.segment_predicted or [rtl.predicted_cycles]) == predicted
    assert rtl.cycles == [sum(predicted)] * 3
    assert re.fullmatch("sample 1: every layer output matches; the difference is in the host "
                        "I/O", first_difference(result, x, 1, log=quiet))
    print(f"\nRTL, {form}: {rtl.cycles[0]} cycles per image (predicted "
          f"{' + '.join(map(str, predicted))} over {len(predicted)} segment(s))")
