"""LeakyRelu, Sigmoid, Tanh, HardSigmoid and HardSwish: the frontend's float ops against
onnxruntime, their int8 lookup tables (quantizer), fusion into the layer before them, and the
golden int8 model against onnxruntime on the float model, within the error the tables allow."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, simulate
from hwonnx.errors import ResourceError
from hwonnx.quant import activation_table
from spec_helpers import check_against_ort, make_model, ort_outputs, rand

#: op, attributes, the Lipschitz constant of the function (its largest slope)
ACTIVATIONS = [("LeakyRelu", {"alpha": 0.1}, 1.0), ("LeakyRelu", {}, 1.0),
               ("Sigmoid", {}, 0.25), ("Tanh", {}, 1.0),
               ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 0.3), ("HardSigmoid", {}, 0.2),
               ("HardSwish", {}, 1.5)]
IDS = [f"{op}{'-' + '-'.join(f'{k}{v}' for k, v in a.items()) if a else ''}"
       for op, a, _ in ACTIVATIONS]


def act_model(op, attrs, shape=(1, 3, 5, 4), opset=17):
    return make_model([helper.make_node(op, ["x"], ["y"], name="act", **attrs)],
                      {"x": list(shape)}, {"y": list(shape)}, opset=opset)


@pytest.mark.parametrize("op, attrs, slope", ACTIVATIONS, ids=IDS)
def test_float_op_equals_onnxruntime(op, attrs, slope):
    graph = check_against_ort(act_model(op, attrs), rtol=1e-5, atol=1e-6)
    (node,) = graph.nodes
    assert node.op == op
    for key, value in attrs.items():
        assert node.attrs[key] == pytest.approx(value)


def test_table_is_the_function_of_each_int8_value():
    table = activation_table("LeakyRelu", {"alpha": 0.25}, (0.5, -10), (0.25, 20))
    q = np.arange(-128, 128)
    x = (q + 10) * 0.5
    want = np.clip(np.rint(np.where(x >= 0, x, 0.25 * x) / 0.25) + 20, -128, 127)
    np.testing.assert_array_equal(table, want)
    assert len(table) == 256


def conv_act_model(op, attrs, rng, channels=4):
    w = rng.normal(0, 0.4, (channels, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["y"], name="act", **attrs)]
    return make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, channels, 6, 6]}, {"w": w})


@pytest.mark.parametrize("op, attrs, slope", ACTIVATIONS, ids=IDS)
def test_activation_fuses_into_the_layer_before_it(op, attrs, slope):
    rng = np.random.default_rng(3)
    model = conv_act_model(op, attrs, rng)
    calib = rng.normal(0, 1, (16, 1, 3, 6, 6)).astype(np.float32)
    result = build(model, None, calib={"x": calib}, verilog=False, log=lambda m: None)
    (layer,) = [n for n in result.graph.nodes if n.op == "QConv"]
    assert (layer.attrs["activation"], len(layer.attrs["table"])) == (op, 256)
    luts = [i["lut"] for i in result.program.expanded() if i["op"] == 3]
    assert luts and set(luts) == {1}             # every POST of the layer (one per M tile)


@pytest.mark.parametrize("op, attrs, slope", ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("seed", range(2))
def test_standalone_activation_is_within_its_quantization_error(op, attrs, slope, seed):
    """input -> activation: the table reads the quantized input, so each output is within
    ``slope * s_in / 2`` (the input's rounding through the function) plus ``s_out / 2`` (the
    output's rounding) of onnxruntime on the float model, for inputs in the calibrated
    range."""
    rng = np.random.default_rng(seed)
    shape = (1, int(rng.integers(1, 12)), int(rng.integers(1, 6)), int(rng.integers(1, 6)))
    model = act_model(op, attrs, shape)
    calib = rng.normal(0, 2, (16,) + shape).astype(np.float32)
    result = build(model, None, calib={"x": calib}, verilog=False, log=lambda m: None)
    assert [layer.op for layer in result.program.layers] == ["QConcat"]   # an identity copy
    got = simulate(result, {"x": calib}, mode="golden").outputs["y"]
    want = np.concatenate([ort_outputs(model, {"x": sample})[1][0] for sample in calib])
    s_in = result.graph.nodes[0].attrs["scale"]
    s_out = result.graph.nodes[-1].attrs["scale"]
    bound = slope * s_in / 2 + s_out / 2
    error = np.abs(got.reshape(want.shape) - want).max()
    print(f"\n{op} {shape}: max |golden - onnxruntime| {error:.4g}, bound {bound:.4g}")
    assert error <= bound * (1 + 1e-4)


def test_too_many_tables_for_the_architecture_is_a_resource_error():
    rng = np.random.default_rng(4)
    nodes, inits, value = [], {}, "x"
    for index, op in enumerate(["Sigmoid", "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid"]):
        inits[f"w{index}"] = rng.normal(0, 0.5, (3, 3, 1, 1)).astype(np.float32)
        nodes += [helper.make_node("Conv", [value, f"w{index}"], [f"c{index}"],
                                   name=f"conv{index}"),
                  helper.make_node(op, [f"c{index}"], [f"a{index}"], name=f"act{index}")]
        value = f"a{index}"
    nodes.append(helper.make_node("Identity", [value], ["y"], name="out"))
    model = make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 3, 4, 4]}, inits)
    calib = rand(8, 1, 3, 4, 4)
    # the simulation target grows the tables to what the model uses; a number given is kept
    grown = build(model, None, calib={"x": calib}, verilog=False, log=lambda m: None)
    assert grown.program.config.lut_tables == 5
    with pytest.raises(ResourceError, match="Layer 'conv4': its HardSigmoid needs activation "
                                            "table 5, but the 8x8 architecture has 4"):
        build(model, None, calib={"x": calib}, verilog=False, lut_tables=4,
              log=lambda m: None)


def _hardswish_chain(layers: int):
    """``layers`` x (Conv 4 -> 4 1x1, HardSwish) on [1, 4, 3, 3], each at other scales: each
    Conv is 1.03 x its input + 5 (where HardSwish is the identity), so every layer's range is
    wider than the one before it."""
    nodes, inits, value = [], {}, "x"
    for index in range(layers):
        inits[f"w{index}"] = (np.eye(4) * 1.03).reshape(4, 4, 1, 1).astype(np.float32)
        inits[f"b{index}"] = np.full(4, 5.0, np.float32)
        nodes += [helper.make_node("Conv", [value, f"w{index}", f"b{index}"], [f"c{index}"],
                                   name=f"conv{index}"),
                  helper.make_node("HardSwish", [f"c{index}"], [f"a{index}"],
                                   name=f"act{index}")]
        value = f"a{index}"
    nodes.append(helper.make_node("Identity", [value], ["y"], name="out"))
    return make_model(nodes, {"x": [1, 4, 3, 3]}, {"y": [1, 4, 3, 3]}, inits)


def test_tables_past_the_lut_field_are_refused_saying_so():
    """70 branches x -> Conv (x 0.5 + 0.1 k) -> HardSwish, concatenated: each HardSwish at its
    own scales, more than the 63 tables a POST names."""
    nodes, inits = [], {}
    for k in range(70):
        inits[f"w{k}"] = (np.eye(4) * (0.5 + 0.1 * k)).reshape(4, 4, 1, 1).astype(np.float32)
        nodes += [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], name=f"conv{k}"),
                  helper.make_node("HardSwish", [f"c{k}"], [f"a{k}"], name=f"act{k}")]
    nodes.append(helper.make_node("Concat", [f"a{k}" for k in range(70)], ["y"], name="cat",
                                  axis=1))
    model = make_model(nodes, {"x": [1, 4, 3, 3]}, {"y": [1, 280, 3, 3]}, inits)
    with pytest.raises(ResourceError, match=r"needs activation table 64, but the 8x8 "
                                            r"architecture has 63 \(lut_tables\); a POST "
                                            r"names at most 63$"):
        build(model, None, calib={"x": rand(8, 1, 4, 3, 3) * 3}, verilog=False,
              log=lambda m: None)


@pytest.mark.rtl
def test_more_tables_than_fifteen_run_bit_exact():
    """MobileNetV3 and LCNet need 16 to 20 activation tables (a HardSwish per block, each at
    its own scales): the POST's lut field names up to 63. Eighteen Conv + HardSwish layers,
    each at other scales (their weights grow by 10% a layer): the simulation target grows to
    18 tables, the RTL equals golden in the predicted cycles; a table past the field is
    refused saying so."""
    from hwonnx.isa import MAX_LUT_TABLES
    from rtl_helpers import rtl_matches_golden

    model = _hardswish_chain(18)
    calib = rand(8, 1, 4, 3, 3)
    result = build(model, None, calib={"x": calib}, log=lambda m: None)
    tables = result.program.config.lut_tables
    assert 15 < tables <= 18 == len(result.program.layers)
    rtl_matches_golden(result, {"x": calib[:2]}, 2)
    assert MAX_LUT_TABLES == 63
    with pytest.raises(ResourceError, match=r"needs activation table \d+, but the 8x8 "
                                            r"architecture has 15 \(lut_tables\); raise "
                                            r"--lut-tables"):
        build(model, None, calib={"x": calib}, verilog=False, lut_tables=15,
              log=lambda m: None)
