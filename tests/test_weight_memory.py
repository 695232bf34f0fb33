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
