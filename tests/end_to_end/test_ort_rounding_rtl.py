"""The onnxruntime rounding mode end to end: a hand-made QDQ model whose scales are powers of
two, so that about one requantized value in a hundred is an exact tie, where half-up and
onnxruntime's ties-to-even differ. On an architecture with the rounding unit the RTL equals
the golden model bit for bit and both equal onnxruntime's reference path (graph optimizations
off: DequantizeLinear, float Conv/Gemm, QuantizeLinear, all exact with these scales) value for
value."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from hwonnx import api
from hwonnx.config import ArchConfig
from ort_reference import reference_outputs

pytestmark = pytest.mark.rtl

# Shared with tests/end_to_end/test_rtl.py (same fields: the same cached Verilator build).
ORT_CONFIG = ArchConfig(rows=4, cols=4, act_depth=2048, wgt_depth=4096, acc_depth=16,
                        par_depth=64, prog_depth=2048, ort_rounding=True)


def _tie_model(path, rng):
    """x -> Q/DQ (1/16) -> Conv 3x3 (weights 1/32, int32 bias) -> Q/DQ (1/4) -> Relu -> Flatten
    -> Gemm (weights 1/64) -> Q/DQ (1/2): requantization multipliers 2**-7 and 2**-5."""
    def q_dq(name, value, scale, out):
        return [helper.make_node("QuantizeLinear", [value, f"{name}_s", f"{name}_z"],
                                 [f"{name}_q"], name=f"{name}_quant"),
                helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                                 [out], name=f"{name}_dequant")], \
            {f"{name}_s": np.float32(scale), f"{name}_z": np.int8(0)}

    inits = {"cw_q": rng.integers(-60, 60, (6, 4, 3, 3)).astype(np.int8),
             "cw_s": np.float32(1 / 32), "cw_z": np.int8(0),
             "cb_q": rng.integers(-300, 300, 6).astype(np.int32),
             "cb_s": np.float32(1 / 512), "cb_z": np.int32(0),
             "fw_q": rng.integers(-60, 60, (6 * 6 * 6, 10)).astype(np.int8),
             "fw_s": np.float32(1 / 64), "fw_z": np.int8(0),
             "fb_q": rng.integers(-300, 300, 10).astype(np.int32),
             "fb_s": np.float32(1 / 256), "fb_z": np.int32(0)}
    nodes = []
    for name in ("cw", "cb", "fw", "fb"):
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s",
                                                           f"{name}_z"], [name], name=name))
    part, more = q_dq("x", "x", 1 / 16, "xd")
    nodes += part
    inits.update(more)
    nodes.append(helper.make_node("Conv", ["xd", "cw", "cb"], ["c"], pads=[1, 1, 1, 1],
                                  name="conv"))
    part, more = q_dq("c", "c", 1 / 4, "cd")
    nodes += part
    inits.update(more)
    nodes += [helper.make_node("Relu", ["cd"], ["r"], name="relu"),
              helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
              helper.make_node("MatMul", ["f", "fw"], ["m"], name="fc"),
              helper.make_node("Add", ["m", "fb"], ["g"], name="fc_bias")]
    part, more = q_dq("g", "g", 1 / 2, "y")
    nodes += part
    inits.update(more)
    graph = helper.make_graph(
        nodes, "ties", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)]),
         path)


def test_ties_round_as_onnxruntime_on_rtl(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "ties.onnx"
    _tie_model(path, rng)
    x = (rng.integers(-100, 100, (24, 4, 6, 6)) / 16).astype(np.float32)
    want = reference_outputs(path, {"x": x})[0]     # onnxruntime's reference path
    q_want = np.rint(want * 2).astype(np.int64)          # the output scale is 1/2

    half_up = api.build(path, None, calib=None, config=ArchConfig(), verilog=False,
                        log=lambda *_: None)
    golden_half_up = api.simulate(half_up, {"x": x}, mode="golden")
    exact = api.build(path, None, calib=None, config=ORT_CONFIG, verilog=False,
                      log=lambda *_: None)
    assert [i["rne"] for i in exact.program.expanded() if i["op"] == 3] != []
    assert all(i["rne"] for i in exact.program.expanded() if i["op"] == 3)
    golden = api.simulate(exact, {"x": x}, mode="golden")
    rtl = api.simulate(exact, {"x": x}, mode="rtl", log=lambda *_: None)

    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [golden.predicted_cycles] * len(x)
    q_golden = golden.int_outputs.reshape(q_want.shape).astype(np.int64)
    q_half_up = golden_half_up.int_outputs.reshape(q_want.shape).astype(np.int64)
    differing_half_up = int(np.count_nonzero(q_half_up != q_want))
    print(f"{differing_half_up} of {q_want.size} int8 outputs differ from onnxruntime with "
          f"half-up rounding, {int(np.count_nonzero(q_golden != q_want))} with onnxruntime's")
    np.testing.assert_array_equal(q_golden, q_want)
    assert differing_half_up > 0          # the model does exercise the ties
