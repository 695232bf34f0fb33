"""A trained-model-shaped QDQ graph (quantize_static, per tensor and per channel): Pad, Conv,
LeakyRelu, two branches (1x1 Conv + ReLU6; 3x3 Conv + x*sigmoid(x)), Concat, AveragePool,
Conv + ReLU, an NHWC Transpose + Reshape, Gemm, Softmax; the golden model layer by layer
against onnxruntime's reference path (issue 36, item 10).

Every layer up to the Concat is equal to the reference. The 2x2 AveragePool (input and output
scale equal) divides window sums by 4: a quarter of its values are exact ties, which the QDQ
float semantics round half to even; rounding them half up was the departure (1,697 of 16,384
values 1 LSB off, 3-4 LSB after the next Conv). A pre-quantized pool now rounds as onnxruntime
does (``rounding="ort"``). What remains is the reference's float32 arithmetic: it moves about
a third of the ties off the tie by under 2e-5 LSB (its pool sums ``(x00 + x10) + (x01 + x11)``
of float32 products), 679 of 16,384 values per tensor, 668 per channel; with the reference's
pool output fed in, every later layer is equal."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hwonnx import api
from hwonnx.config import ArchConfig
from hwonnx.golden import evaluate
from hwonnx.isa import Op

from ort_reference import reference_session
from prequantized_helpers import Reader
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

#: Largest difference of the Gemm's int8 logits from the reference (measured: 2 LSB per
#: tensor and per channel; 3 LSB with the pool rounding half up).
LOGIT_LSB = 2


def _float_model(rng) -> onnx.ModelProto:
    def w(*shape, s):
        return rng.normal(0, s, shape).astype(np.float32)
    inits = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "c1_w": w(8, 3, 3, 3, s=.3), "c1_b": w(8, s=.1), "b1_w": w(8, 8, 1, 1, s=.5),
             "b1_b": w(8, s=.1), "b2_w": w(8, 8, 3, 3, s=.2), "b2_b": w(8, s=.1),
             "lo": np.float32(0), "hi": np.float32(6), "c3_w": w(16, 16, 3, 3, s=.15),
             "c3_b": w(16, s=.1), "shape": np.array([1, -1], np.int64),
             "fc_w": w(10, 256, s=.05), "fc_b": w(10, s=.1)}
    n = helper.make_node
    nodes = [n("Pad", ["x", "pads"], ["p"], name="pad"),
             n("Conv", ["p", "c1_w", "c1_b"], ["c1"], name="c1"),
             n("LeakyRelu", ["c1"], ["l1"], alpha=0.1, name="leaky"),
             n("Conv", ["l1", "b1_w", "b1_b"], ["b1"], name="b1"),
             n("Clip", ["b1", "lo", "hi"], ["r6"], name="relu6"),
             n("Conv", ["l1", "b2_w", "b2_b"], ["b2"], pads=[1, 1, 1, 1], name="b2"),
             n("Sigmoid", ["b2"], ["sg"], name="sig"), n("Mul", ["b2", "sg"], ["sw"], name="sw"),
             n("Concat", ["r6", "sw"], ["cat"], axis=1, name="cat"),
             n("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], name="ap"),
             n("Conv", ["ap", "c3_w", "c3_b"], ["c3"], pads=[1, 1, 1, 1], name="c3"),
             n("Relu", ["c3"], ["r3"], name="relu3"),
             n("Transpose", ["r3"], ["t"], perm=[0, 2, 3, 1], name="nhwc"),
             n("Reshape", ["t", "shape"], ["f"], name="flat"),
             n("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
             n("Softmax", ["logits"], ["y"], axis=-1, name="softmax")]
    graph = helper.make_graph(
        nodes, "branches", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", 1, [1, 10])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


def _quantized(tmp_path, per_channel: bool):
    float_path, path = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(_float_model(np.random.default_rng(0)), float_path)
    quantize_static(str(float_path), str(path), Reader((1, 3, 8, 8), 3),
                    quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return path


def _reference(path, x):
    """The reference path's int8 codes of every quantized value (uint8 - 128, by float name),
    the AveragePool's float output over its output scale, and the Softmax output."""
    model = onnx.load(str(path))
    quantizers = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    model.graph.output.extend([helper.make_tensor_value_info(n.output[0], 2, None)
                               for n in quantizers.values()] +
                              [helper.make_tensor_value_info("ap", 1, None)])
    session = reference_session(model)
    names = [o.name for o in session.get_outputs()]
    runs = [dict(zip(names, session.run(None, {"x": x[i:i + 1]}))) for i in range(len(x))]
    out = {k: np.concatenate([r[k] for r in runs]) for k in names}
    codes = {v: out[q.output[0]].astype(np.int64) - 128 for v, q in quantizers.items()}
    scale = next(numpy_helper.to_array(i) for i in model.graph.initializer
                 if i.name == quantizers["ap"].input[1])
    return codes, out["ap"] / np.float32(scale), out["y"]


@pytest.mark.parametrize("per_channel", [False, True])
def test_branches_match_the_reference_path(tmp_path, per_channel):
    path = _quantized(tmp_path, per_channel)
    result = api.build(path, None, calib=None, config=ArchConfig(ort_rounding=True),
                       verilog=False, log=lambda *_: None)
    x = np.random.default_rng(11).normal(0, 1, (64, 3, 8, 8)).astype(np.float32)
    env = evaluate(result.graph, {"x": x}, keep_all=True)
    codes, pool, y_ref = _reference(path, x)
    lsb = {v: np.abs(env[f"{v}:q"].astype(np.int64).reshape(codes[v].shape) - codes[v])
           for v in ("l1", "r6", "b2", "sg", "sw", "cat", "ap", "r3", "logits")}
    print({v: (int(d.max()), int(np.count_nonzero(d))) for v, d in lsb.items()})
    assert all(lsb[v].max() == 0 for v in ("l1", "r6", "b2", "sg", "sw", "cat"))
    # the pool differs only where the reference's float32 value is off an exact tie
    off = lsb["ap"].reshape(pool.shape) != 0
    assert lsb["ap"].max() == 1 and np.all(pool[off] % 1 != 0.5)
    assert lsb["logits"].max() <= LOGIT_LSB
    y = env["y"].reshape(y_ref.shape)
    assert np.abs(y - y_ref).max() < 0.01
    # top-1 equal wherever the reference's margin exceeds what 2 x LOGIT_LSB could flip
    top2 = np.sort(codes["logits"], axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * LOGIT_LSB
    assert np.array_equal(y.argmax(1)[clear], y_ref.argmax(1)[clear])


@pytest.mark.rtl
def test_branches_on_rtl(tmp_path):
    """The pool's POST rounds half to even (``rne``), as the model's Conv and Gemm layers do,
    and the RTL equals golden bit for bit."""
    from tests.end_to_end.test_ort_rounding_rtl import ORT_CONFIG
    path = _quantized(tmp_path, False)
    result = api.build(path, None, calib=None, config=ORT_CONFIG, log=lambda *_: None)
    layers = result.program.layers
    pool = [i.fields.get("rne") for i in result.program.expanded()
            if i["op"] in (Op.POST, Op.SETPOST) and layers[i.layer].name == "ap"]
    assert pool and all(pool)
    x = np.random.default_rng(11).normal(0, 1, (4, 3, 8, 8)).astype(np.float32)
    golden = api.simulate(result, {"x": x}, mode="golden")
    rtl = api.simulate(result, {"x": x}, mode="rtl", log=lambda *_: None)
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [golden.predicted_cycles] * len(x)
