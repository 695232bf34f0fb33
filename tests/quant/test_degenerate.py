"""Degenerate layers are no error: output channels whose weights are (nearly) zero, weights
too small for their bias, and an accumulator bound taken from the actual weights, bias and
input zero point. Each model is built in float form (calibrated) and as onnxruntime's
per-channel (and, golden only, per-tensor) QDQ quantization of it; golden against the float
model (onnxruntime) within a bound derived from the scales, against the QDQ model's
reference path within 1 LSB, and on the RTL bit-exact with the predicted cycles."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from hwonnx import api
from hwonnx.config import ArchConfig
from hwonnx.compiler.lower import lower
from hwonnx.errors import QuantizationError, ResourceError
from hwonnx.frontend import load_model
from hwonnx.golden import evaluate, quantize
from hwonnx.isa import Op
from hwonnx.quant import quantize_model
from spec_helpers import make_model
from ort_reference import reference_outputs

ort.set_default_logger_severity(3)
SAMPLES = 48
DEAD, TINY, ZERO = 33, 7, 20   # the dead neurons of the MLP: bias 0.3, 0, 0.2


def _model(nodes, inits, in_shape, out_shape):
    return make_model(nodes, {"x": in_shape}, {"y": out_shape},
                      {k: np.asarray(v, np.float32) for k, v in inits.items()}, opset=13)


def dead_neuron_mlp():
    """A 64 -> 48 -> 10 MLP whose hidden neurons 33, 7 and 20 are dead: weights of the order
    of 1e-9 and 1e-11 (what weight decay leaves) and exactly 0, biases 0.3, 0 and 0.2.
    Before: channel 33's bias overflowed int32 at the usual weight scale, channel 7's
    requantization scale (about 1e-12) was beyond the 31-bit multiplier."""
    rng = np.random.default_rng(5)
    w1, b1 = rng.normal(0, 0.3, (64, 48)), rng.normal(0, 0.1, 48)
    w1[:, DEAD], b1[DEAD] = rng.normal(0, 1e-9, 64), 0.3
    w1[:, TINY], b1[TINY] = rng.normal(0, 1e-11, 64), 0.0
    w1[:, ZERO], b1[ZERO] = 0.0, 0.2
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu1"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2")]
    inits = {"w1": w1, "b1": b1, "w2": rng.normal(0, 0.3, (48, 10)),
             "b2": rng.normal(0, 0.1, 10)}
    return _model(nodes, inits, [1, 64], [1, 10]), [(64, "fc1", "r"), (48, "fc2", "y")]


def tiny_weights_large_bias():
    """A 16 -> 8 Gemm with weights of the order of 1e-5 and biases up to 60: at the usual
    weight scale (max |w| / 127) the int32 bias of every channel was beyond int32 (bound
    about 2.5e10)."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")]
    inits = {"w": rng.normal(0, 1e-5, (16, 8)), "b": rng.uniform(-60, 60, 8)}
    return _model(nodes, inits, [1, 16], [1, 8]), [(16, "fc", "y")]


MODELS = {"dead_neuron_mlp": dead_neuron_mlp, "tiny_weights_large_bias": tiny_weights_large_bias}


def _samples(k):
    return np.random.default_rng(9).normal(0, 1, (SAMPLES, 1, k)).astype(np.float32)


class _Reader(CalibrationDataReader):
    def __init__(self, x):
        self.data = iter([{"x": sample} for sample in x])

    def get_next(self):
        return next(self.data, None)


def _build(tmp_path, kind, form):
    model, layers = MODELS[kind]()
    x = _samples(layers[0][0])
    path = tmp_path / f"{kind}.onnx"
    onnx.save(model, path)
    if form.startswith("qdq"):
        qdq = tmp_path / f"{kind}_{form}.onnx"
        quantize_static(str(path), str(qdq), _Reader(x), quant_format=QuantFormat.QDQ,
                        per_channel=form == "qdq", activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        return api.build(qdq, None, calib=None, config=ArchConfig(), verilog=False,
                         log=lambda *_: None), model, layers, x, qdq
    return api.build(path, None, calib={"x": x}, config=ArchConfig(), verilog=False,
                     log=lambda *_: None), model, layers, x, None


def _float_values(model, x, names):
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names
                              if n != "y")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [session.run(names, {"x": sample}) for sample in x]
    return {name: np.concatenate([run[i] for run in runs]) for i, name in enumerate(names)}


@pytest.mark.parametrize("form", ["float", "qdq", "qdq_per_tensor"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_degenerate_model_matches_references(tmp_path, kind, form):
    """Golden vs the float model, layer by layer: the dequantized int8 output of a layer
    ``y = x w + b`` is within ``s_out / 2`` (its rounding) ``+ sum_k |w_k| e_k`` (the error
    ``e`` of its input, ``s_in / 2`` for the quantized graph input) ``+ sum_k |x_k| s_w / 2 +
    s_in s_w / 2`` (weights and bias rounded at the weight scale ``s_w = max |w| / 127`` of
    the channel, or the QDQ model's own) of onnxruntime's float value; 1e-6 more for the
    dead channels, whose weights (at most 1e-8 in all) round to 0. In QDQ form also within
    1 LSB of onnxruntime's reference path of the quantized model. A dead neuron outputs its
    bias, quantized."""
    result, model, layers, x, qdq = _build(tmp_path, kind, form)
    graph = result.graph
    quant = next(n for n in graph.nodes if n.op == "Quantize")
    env = evaluate(graph, {quant.outputs[0]: quantize(x[:, 0], **quant.attrs)}, keep_all=True)
    names = [out for _, _, out in layers]
    floats = _float_values(model, x, names)
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64)
             for i in model.graph.initializer}
    nodes = {n.name: n for n in graph.nodes}
    qdq_inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(qdq).graph.initializer} \
        if qdq is not None else {}
    err, prev = np.full(x.shape, quant.attrs["scale"] / 2), x.astype(np.float64)
    for k, (_, layer, out) in enumerate(layers):
        node = nodes[layer]
        s_in, s_out, zp = node.attrs["in_scale"], node.attrs["out_scale"], node.attrs["out_zp"]
        w_name = f"w{k + 1}" if kind == "dead_neuron_mlp" else "w"
        w = inits[w_name]
        got = (env[node.outputs[0]].astype(np.float64) - zp) * s_out
        s_w = np.abs(w).max(axis=0) / 127
        if qdq is not None:          # the model's weight scales (1 for an all-zero channel)
            s_w = np.broadcast_to(qdq_inits[f"{w_name}_scale"].astype(np.float64), s_w.shape)
        bound = (s_out / 2 + err.reshape(len(x), -1) @ np.abs(w)
                 + np.abs(prev.reshape(len(x), -1)) @ np.ones_like(w) * s_w / 2
                 + s_in * s_w / 2 + 1e-6)
        error = np.abs(got.reshape(bound.shape) - floats[out].reshape(bound.shape))
        print(f"{kind} {form} {layer}: largest error {(error / s_out).max():.3f} LSB, "
              f"bound {(bound / s_out).min():.3f}..{(bound / s_out).max():.3f} LSB")
        assert (error <= bound).all(), (layer, float((error - bound).max()))
        err, prev = error, got
    if kind == "dead_neuron_mlp":
        fc1 = nodes["fc1"]
        hidden = env[fc1.outputs[0]].reshape(len(x), -1)
        biases = inits["b1"]
        if qdq is not None:            # the bias the QDQ model gives (its int32, dequantized)
            biases = qdq_inits["b1_quantized"] * qdq_inits["b1_quantized_scale"]
        for channel in (DEAD, TINY, ZERO):                   # ReLU(bias), quantized
            bias = np.float32(biases[channel])
            expected = quantize(np.float32(max(bias, 0.0)), scale=fc1.attrs["out_scale"],
                                zero_point=fc1.attrs["out_zp"])
            assert (hidden[:, channel] == expected).all()
            assert hidden[:, channel].dtype == np.int8
        if form == "float":        # an all-zero channel: the bias through multiplier 1
            consts = [graph.constants[v] for v in fc1.inputs[1:5]]
            assert not consts[0][:, ZERO].any()
            assert (consts[2][ZERO], consts[3][ZERO]) == (1 << 30, 30)
        if form != "qdq_per_tensor":      # (per tensor, its weights simply quantize to 0)
            warnings = " ".join(graph.meta["warnings"])
            assert "Layer 'fc1'" in warnings and "(nearly) zero weights" in warnings
    if qdq is not None:
        y_ref = reference_outputs(onnx.load(qdq), {"x": x[:, 0]})[0]
        fc = nodes[layers[-1][1]]
        lsb = np.abs(env[result.program.output_value].astype(np.float64).reshape(len(x), -1)
                     - fc.attrs["out_zp"] - y_ref.reshape(len(x), -1) / fc.attrs["out_scale"])
        print(f"{kind} qdq vs onnxruntime's reference path: largest {lsb.max():.3f} LSB")
        assert lsb.max() <= 1 + 1e-3


@pytest.mark.rtl
@pytest.mark.parametrize("form", ["float", "qdq"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_degenerate_model_on_rtl(tmp_path, kind, form):
    """The degenerate models on the 8x8 RTL: bit-exact with golden, cycles as predicted."""
    result, _, _, x, _ = _build(tmp_path, kind, form)
    golden = api.simulate(result, {"x": x}, mode="golden")
    rtl = api.simulate(result, {"x": x}, mode="rtl", log=lambda *_: None)
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [golden.predicted_cycles] * len(x)


def test_accumulator_bound_uses_the_input_zero_point():
    """A 70,000-input Gemm with weights that quantize to +-127: 70,000 x 127 x 255 overflows
    int32, but its inputs are symmetric (zero point 0 or so), so no |x - zp| exceeds 129 and
    the actual bound 70,000 x 127 x 129 fits: it quantizes."""
    k = 70_000
    rng = np.random.default_rng(1)
    w = np.where(rng.random((k, 1)) < 0.5, -0.01, 0.01)
    model = _model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")], {"w": w},
                   [1, k], [1, 1])
    x = rng.uniform(-1, 1, (4, 1, k)).astype(np.float32)
    graph = quantize_model(load_model(model), {"x": x})
    fc = next(n for n in graph.nodes if n.op == "QDense")
    assert abs(fc.attrs["in_zp"]) <= 1
    assert np.abs(graph.constants[fc.inputs[1]]).min() == 127
    # the compiler's own bound check (per source, with its zero point) passes too: what
    # stops this layer is that its 70,000 weight words are more than an instruction addresses
    with pytest.raises(ResourceError, match="^The model needs 70000 words of the wgt buffer, "
                                            "more than the 65536 an instruction can address"):
        lower(graph, ArchConfig(act_depth=1 << 15))


def test_impossible_layer_says_what_to_do():
    """The same Gemm on inputs in [0, 1] (zero point -128: |x - zp| up to 255) cannot keep
    its sums in int32: one line naming the layer, the channel, the bound and the remedy."""
    k = 70_000
    model = _model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")],
                   {"w": np.full((k, 1), 0.01)}, [1, k], [1, 1])
    x = np.random.default_rng(1).uniform(0, 1, (4, 1, k)).astype(np.float32)
    message = (f"Layer 'fc': output channel 0 could overflow the int32 accumulator: sum |w| x "
               f"255 (the largest |x - zero point|) + |bias| = {k * 127 * 255} > 2147483647 "
               f"over its {k} inputs; split the layer into layers of fewer inputs whose "
               f"outputs an Add sums")
    with pytest.raises(QuantizationError, match="^" + re.escape(message) + "$"):
        quantize_model(load_model(model), {"x": x})


def test_model_multiplier_underflowing_float32_is_fitted(tmp_path):
    """A QDQ model whose weight scale of a dead channel is the smallest float32 (1.4e-45):
    onnxruntime's multiplier (input scale x weight scale / output scale, in float32) is 0.
    The channel is fitted like any dead one and outputs its bias, quantized."""
    model, _ = dead_neuron_mlp()
    x = _samples(64)
    path, qdq = tmp_path / "mlp.onnx", tmp_path / "mlp_qdq.onnx"
    onnx.save(model, path)
    quantize_static(str(path), str(qdq), _Reader(x), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    quantized = onnx.load(qdq)
    scale = next(i for i in quantized.graph.initializer if i.name == "w1_scale")
    values = numpy_helper.to_array(scale).copy()
    values[TINY] = np.float32(1.4e-45)
    scale.CopyFrom(numpy_helper.from_array(values, "w1_scale"))
    result = api.build(quantized, None, calib=None, config=ArchConfig(), verilog=False,
                       log=lambda *_: None)
    fc1 = next(n for n in result.graph.nodes if n.name == "fc1")
    assert np.float32(fc1.attrs["in_scale"]) * values[TINY] / np.float32(
        fc1.attrs["out_scale"]) == 0
    quant = next(n for n in result.graph.nodes if n.op == "Quantize")
    env = evaluate(result.graph, {quant.outputs[0]: quantize(x[:, 0], **quant.attrs)},
                   keep_all=True)
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    bias = np.float32(inits["b1_quantized"][TINY] * inits["b1_quantized_scale"][TINY])
    expected = quantize(np.float32(max(bias, 0)), scale=fc1.attrs["out_scale"],
                        zero_point=fc1.attrs["out_zp"])
    assert (env[fc1.outputs[0]].reshape(len(x), -1)[:, TINY] == expected).all()


def test_weights_beyond_the_address_field_stream_from_an_external_memory():
    """Three Gemms 480 -> 500 -> 480 -> 500: on 8x8 each takes 30,240 weight words (480 inputs
    x 63 tiles of 8 outputs; 504 inputs, rounded up to 8, x 60 tiles), 90,720 together, more
    than the 65,536 a LOADW addresses. Without an external memory the build says to stream
    them; with one (--ext-memory on --board sim) two slots of 30,240 words hold the layer
    that runs and the next, and it builds."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Gemm", [src, f"w{i}"], [dst], name=f"fc{i}", transB=1)
             for i, (src, dst) in enumerate([("x", "h0"), ("h0", "h1"), ("h1", "y")])]
    sizes = [480, 500, 480, 500]
    weights = {f"w{i}": rng.normal(0, 1 / np.sqrt(sizes[i]), (sizes[i + 1], sizes[i]))
               for i in range(3)}
    model = _model(nodes, weights, [1, 480], [1, 500])
    calib = {"x": rng.normal(0, 1, (4, 1, 480)).astype(np.float32)}
    with pytest.raises(ResourceError, match=r"^The model needs 90720 words of the wgt buffer, "
                                            r"more than the 65536 an instruction can address; "
                                            r"use a larger array \(--rows/--cols: wider "
                                            r"words, fewer of them\); or stream the weights "
                                            r"from an external memory \(--ext-memory: "):
        api.build(model, None, calib=calib, verilog=False, log=lambda message: None)
    result = api.build(model, None, calib=calib, ext_memory="ulx3s-sdram", verilog=False,
                       log=lambda message: None)
    assert result.program.words["wgt"] <= 65536
    assert sum(1 for i in result.program.instructions if i["op"] == Op.LOADX) >= 2
