"""The weight memory each layer takes (issue 14: "the report shows weight memory per layer"):
every weight tile is ``rows`` words of ``cols`` bytes, stored once, one per (K tile, N tile)."""

import numpy as np
from onnx import helper

from hwonnx.api import build
from hwonnx.config import ArchConfig
from hwonnx.report import write_report
from spec_helpers import make_model


def test_report_gives_each_layers_weight_words_and_bytes(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "g"], ["y"], name="fc")]
    model = make_model(nodes, {"x": [1, 12, 4, 4]}, {"y": [1, 10]},
                       {"w": rng.normal(0, .3, (9, 12, 3, 3)).astype(np.float32),
                        "g": rng.normal(0, .3, (144, 10)).astype(np.float32)}, opset=13)
    config = ArchConfig(rows=8, cols=8)
    result = build(model, None, calib={"x": rng.normal(0, 1, (8, 1, 12, 4, 4)).astype(
        np.float32)}, config=config, verilog=False, log=lambda *_: None)
    rows, cols = config.rows, config.cols
    n_tiles = -(-9 // cols), -(-10 // cols)
    # the Conv: 3x3 taps x ceil(12 / 8) channel blocks; the Gemm reads the flattened image,
    # 16 pixels x 2 words (12 channels in 16 lanes), one K tile per word
    want = {"conv": 9 * 2 * n_tiles[0] * rows, "fc": 16 * 2 * n_tiles[1] * rows}
    layers = {layer["name"]: layer for layer in result.report["layers"]}
    assert {name: layer["weight_words"] for name, layer in layers.items()} == want
    assert {name: layer["weight_bytes"] for name, layer in layers.items()} == {
        name: words * cols for name, words in want.items()}
    assert sum(want.values()) == result.program.words["wgt"]
    write_report(result.report, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| layer | op | MACs | tiles | weight bits | weight bytes | predicted cycles | " \
        "utilization |" in text
    assert f"| conv | QConv | {result.program.layers[0].macs:,} | {layers['conv']['tiles']} | " \
        f"8 | {want['conv'] * cols:,} |" in text


def test_low_bit_qonnx_layers_take_a_half_or_a_quarter_of_the_words(tmp_path):
    """The same QONNX network with 8-, 4- and 2-bit convolution weights (quantized biases, so
    the model's integers are the layer's, unwidened): the convolutions' weight words halve at
    4 bits and quarter at 2 bits (an 8x8 array: a tile is 8, 4 or 2 words), the Gemm keeps its
    8-bit weights and its words."""
    from qonnx_helpers import conv_net

    config = ArchConfig(rows=8, cols=8, act_depth=2048, wgt_depth=4096, acc_depth=16,
                        ort_rounding=True)
    layers = {}
    for wbits in (8, 4, 2):
        result = build(conv_net(3, wbits=wbits, abits=4), None, calib=None, config=config,
                       verilog=False, log=lambda *_: None)
        layers[wbits] = {layer["name"]: layer for layer in result.report["layers"]}
        assert sum(layer["weight_words"] for layer in layers[wbits].values()) == \
            result.program.words["wgt"]
    words = {wbits: {name: layer["weight_words"] for name, layer in by_name.items()}
             for wbits, by_name in layers.items()}
    assert set(words[8]) == {"c1", "c2", "g"}
    for name in ("c1", "c2"):
        assert words[8][name] > 0
        assert words[4][name] * 2 == words[8][name]
        assert words[2][name] * 4 == words[8][name]
    assert words[8]["g"] == words[4]["g"] == words[2]["g"]
    assert {wbits: [by_name[name]["weight_bits"] for name in ("c1", "c2", "g")]
            for wbits, by_name in layers.items()} == {8: [8, 8, 8], 4: [4, 4, 8], 2: [2, 2, 8]}
    write_report(result.report, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert f"| 2 | {words[2]['c1'] * 8:,} |" in text
