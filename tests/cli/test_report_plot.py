"""The build report's chart (hwonnx/plots.py) and the split of each layer's predicted cycles
it draws (hwonnx.report.cycle_breakdown): every build writes ``report.png`` beside
``report.md``, listed in the manifest, and ``hwonnx inspect --plot`` writes the same chart
without building. The PNG is opened and its size, colours and bar areas checked against the
cycles of report.json."""

import contextlib
import copy
import hashlib
import io
import json
import re

import numpy as np
import pytest
from matplotlib.image import imread

from hwonnx.api import build, load_build
from hwonnx.cli import main
from hwonnx.compiler.paging import truncated
from hwonnx.compiler.timing import predict
from hwonnx.config import ArchConfig
from hwonnx.isa import Op
from hwonnx.plots import MAX_BARS, chart_rows, cycle_figure, write_cycle_chart
from hwonnx.report import CYCLE_CATEGORIES, layer_cycles

from compiler_helpers import streamed_model

#: The colours of the chart's categories (hwonnx.plots): compute, weight loads, boundaries,
#: host.
COLOURS = {"compute": (0x1F, 0x77, 0xB4), "weight_loads": (0xFF, 0x7F, 0x0E),
           "boundaries": (0x2C, 0xA0, 0x2C), "host": (0xD6, 0x27, 0x28)}


@pytest.fixture(scope="module")
def cnn_build(tmp_path_factory):
    """``hwonnx build digits_cnn -o out`` (board sim) once for the module."""
    out = tmp_path_factory.mktemp("plot") / "cnn"
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["build", "digits_cnn", "-o", str(out)]) == 0
    return out


def pixels(path):
    """The PNG at ``path`` as ``uint8`` RGB rows."""
    image = imread(path)
    assert image.dtype == np.float32 and image.ndim == 3 and image.shape[2] in (3, 4)
    return np.rint(image[:, :, :3] * 255).astype(np.uint8)


def colour_areas(rgb) -> "dict[str, int]":
    """Pixels of exactly each category's colour (the bars' insides and the legend's keys)."""
    return {key: int(np.all(rgb == colour, axis=2).sum()) for key, colour in COLOURS.items()}


def assert_not_blank(rgb, bars: int):
    """A chart of sensible size with ``bars`` bars: text, grid and legend in many colours,
    a plot frame (black lines across most of the width), and inside it, in the first column
    of the bars, as many separate runs of the compute colour (every bar starts with some
    compute). Axes without bars cover 5% of the picture."""
    height, width, _ = rgb.shape
    assert 250 <= height <= 1500 and 700 <= width <= 1600, rgb.shape
    coloured = np.any(rgb < 245, axis=2).mean()
    assert 0.03 < coloured < 0.9, coloured                # drawn on, not painted over
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20
    frame = np.flatnonzero(np.all(rgb < 60, axis=2).mean(axis=1) > 0.5)
    assert len(frame) >= 2 and frame[-1] - frame[0] > 100, frame
    compute = np.all(rgb[frame[0]:frame[-1]] == COLOURS["compute"], axis=2)
    column = compute[:, np.argmax(compute.sum(axis=0))].astype(int)
    assert np.count_nonzero(np.diff(column, prepend=0) == 1) == bars


def test_categories_add_up_to_each_layers_cycles(cnn_build):
    """Each layer's split adds up to its predicted cycles in report.json (the cycle model's
    per-layer numbers), and the layers to the total; the compute cycles are the words the
    MATMULs issue, whatever layer's window they fall in."""
    report = json.loads((cnn_build / "report.json").read_text())
    program = load_build(cnn_build).program
    assert [layer["predicted_cycles"] for layer in report["layers"]] == layer_cycles(program)
    for layer in report["layers"]:
        split = layer["cycle_breakdown"]
        assert tuple(split) == CYCLE_CATEGORIES
        assert all(isinstance(v, int) and v >= 0 for v in split.values()), layer
        assert sum(split.values()) == layer["predicted_cycles"], layer
        assert split["host"] == 0
    total = predict(program.expanded(), program.config).total
    assert report["total"]["predicted_cycles"] == total == sum(
        layer["predicted_cycles"] for layer in report["layers"])
    words = sum(i["count"] for i in program.expanded() if i.op == Op.MATMUL)
    assert sum(layer["cycle_breakdown"]["compute"] for layer in report["layers"]) == words
    # The dense layer loads 10x256 weights to use them once: it waits on its loads; the
    # convolutions reuse theirs over every pixel.
    layers = {layer["name"]: layer["cycle_breakdown"] for layer in report["layers"]}
    assert layers["fc_Gemm"]["weight_loads"] > layers["fc_Gemm"]["compute"]
    assert all(layers[n]["compute"] > 5 * layers[n]["weight_loads"]
               for n in ("conv1_Conv", "conv2_Conv"))


def test_each_layer_has_its_window_of_the_timeline(cnn_build):
    """report.json's ``cycle_window`` of each layer: from the end of the program truncated
    before it to the end of the one truncated after it (the END's dispatch in the cycle
    model), so the windows follow one another from 0 to the total; report.md shows each as
    its first and last cycle."""
    report = json.loads((cnn_build / "report.json").read_text())
    program = load_build(cnn_build).program
    ends = [predict(truncated(program, i).expanded(), program.config).total
            for i in range(len(program.layers))]
    windows = [layer["cycle_window"] for layer in report["layers"]]
    assert windows == [[first, end] for first, end in zip([0] + ends[:-1], ends)]
    assert len(windows) == 3 and all(first < end for first, end in windows)
    assert windows[-1][1] == report["total"]["predicted_cycles"]
    markdown = (cnn_build / "report.md").read_text()
    assert "| predicted cycles | utilization | cycle window |" in markdown
    for layer, (first, end) in zip(report["layers"], windows):
        assert re.search(rf"^\| {re.escape(layer['name'])} \|.* \| {first:,}–{end - 1:,} \|$",
                         markdown, re.M), layer["name"]


def test_build_writes_the_chart_into_the_manifest(cnn_build):
    png = (cnn_build / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    files = json.loads((cnn_build / "manifest.json").read_text())["files"]
    assert files["report.png"] == {"size": len(png), "sha256": hashlib.sha256(png).hexdigest()}
    assert "![cycles per layer](report.png)" in (cnn_build / "report.md").read_text()
    load_build(cnn_build)                  # the folder checks whole with its chart


def test_chart_bars_are_the_reports_cycles(cnn_build):
    """The PNG is a chart, not a blank: each category's colour covers an area proportional
    to its cycles over all layers (the bars are equally high); the host's colour, 0 cycles,
    appears in the legend alone, whose keys are the same size for every category."""
    rgb = pixels(cnn_build / "report.png")
    assert_not_blank(rgb, bars=3)
    assert np.any(rgb < 245, axis=2).mean() > 0.2         # three long bars
    report = json.loads((cnn_build / "report.json").read_text())
    cycles = {key: sum(layer["cycle_breakdown"][key] for layer in report["layers"])
              for key in COLOURS}
    areas = colour_areas(rgb)
    legend = areas["host"]
    assert cycles["host"] == 0 and 50 < legend < 1000, areas
    per_cycle = (areas["compute"] - legend) / cycles["compute"]
    assert per_cycle > 20, areas                          # bars of some height and length
    for key in ("weight_loads", "boundaries"):
        assert cycles[key] > 0
        assert (areas[key] - legend) / cycles[key] == pytest.approx(per_cycle, rel=0.1), key


def test_inspect_plot_draws_the_builds_chart(cnn_build, tmp_path, capsys):
    """``hwonnx inspect --plot``: the chart of the same plan, without a build."""
    path = tmp_path / "cycles.png"
    assert main(["inspect", "digits_cnn", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"\nChart written to {path}\n")
    rgb = pixels(path)
    assert_not_blank(rgb, bars=3)
    assert np.array_equal(rgb, pixels(cnn_build / "report.png"))
    assert [p.name for p in tmp_path.iterdir()] == ["cycles.png"]     # no temporary left


@pytest.mark.parametrize("where, why", [("missing/cycles.png", "No such file or directory"),
                                        (".", "Is a directory")])
def test_inspect_plot_to_a_path_that_cannot_be_written(tmp_path, capsys, where, why):
    path = tmp_path / where
    assert main(["inspect", "digits_cnn", "--plot", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""                                      # refused before anything runs
    assert err == f"hwonnx: error: Cannot write the chart to '{path}': {why}\n"


def _report(cnn_build, count):
    """digits_cnn's report.json with ``count`` layers of made-up cycles."""
    report = json.loads((cnn_build / "report.json").read_text())
    template = report["layers"][0]
    report["layers"] = []
    for index in range(count):
        cycles = 100 + (index * 37) % 1000
        report["layers"].append({**copy.deepcopy(template), "name": f"/blocks.{index}/conv/Conv",
                                 "predicted_cycles": cycles,
                                 "cycle_breakdown": {"compute": cycles - 30, "weight_loads": 20,
                                                     "boundaries": 10, "host": 0}})
    return report


def test_many_layers_fold_into_the_costliest(cnn_build, tmp_path):
    """150 layers: the 40 costliest in program order and one bar for the other 110, in a
    figure of capped height whose title says so."""
    report = _report(cnn_build, 150)
    axes = cycle_figure(report).axes[0]
    labels = [t.get_text() for t in axes.get_yticklabels()]
    assert len(labels) == MAX_BARS + 1 and labels[-1] == "110 others"
    costliest = sorted(range(150), key=lambda i: -report["layers"][i]["predicted_cycles"])
    assert labels[:-1] == [f"/blocks.{i}/conv/Conv" for i in sorted(costliest[:MAX_BARS])]
    assert "the 40 costliest of 150 bars" in axes.get_title()
    write_cycle_chart(report, tmp_path / "many.png")
    rgb = pixels(tmp_path / "many.png")
    assert_not_blank(rgb, bars=MAX_BARS + 1)
    assert rgb.shape[0] <= 1400


def test_round_trips_and_older_reports(cnn_build):
    """A segmented report: a host bar after each segment's last layer, its UART time in
    cycles at the clock; a layer of a report without the split is one grey bar."""
    report = _report(cnn_build, 3)
    for layer, segment in zip(report["layers"], (1, 1, 2)):
        layer["segment"] = segment
    report["round_trips"] = [{"after_segment": 1, "link_seconds": 0.002, "baud": 115200}]
    del report["layers"][2]["cycle_breakdown"]
    rows = chart_rows(report)
    clock = report["arch"]["clock_hz"]
    assert [name for name, _ in rows] == ["/blocks.0/conv/Conv", "/blocks.1/conv/Conv",
                                          "host after segment 1", "/blocks.2/conv/Conv"]
    assert rows[2][1] == {"host": round(0.002 * clock)}
    assert rows[3][1] == {"unsplit": report["layers"][2]["predicted_cycles"]}
    title = cycle_figure(report).axes[0].get_title()
    assert re.search(rf"and {round(0.002 * clock):,} cycles of host round trips", title)


#: 8x8 array whose weight buffer (1,280 words) is too small for the model's 1,824 weight
#: words: the largest layers' weights stream from the external memory (LOADX).
STREAMED = ArchConfig(act_depth=1024, wgt_depth=1280, acc_depth=256, par_depth=64,
                      prog_depth=256, ext_memory="ulx3s-sdram", ext_depth=4096)


def test_streamed_weights_count_as_weight_loads():
    """With weights streamed over the DMA, a layer's LOADX time not hidden behind the
    computation is weight loading; the split still adds up to each layer's cycles."""
    calib = {"x": np.random.default_rng(1).random((8, 8, 6, 6)).astype(np.float32)}
    result = build(streamed_model(), None, config=STREAMED, calib=calib, log=lambda m: None)
    program = result.program
    assert any(i.op == Op.LOADX for i in program.expanded())
    layers = result.report["layers"]
    assert [layer["predicted_cycles"] for layer in layers] == layer_cycles(program)
    for layer in layers:
        split = layer["cycle_breakdown"]
        assert min(split.values()) >= 0 and sum(split.values()) == layer["predicted_cycles"]
    assert sum(layer["cycle_breakdown"]["compute"] for layer in layers) == sum(
        i["count"] for i in program.expanded() if i.op == Op.MATMUL)
    streamed = [layer for layer in layers if layer["external_bytes"]]
    first = layers[0]["cycle_breakdown"]
    assert layers[0] in streamed and first["weight_loads"] > first["compute"] / 2


def test_names_are_text(cnn_build, tmp_path):
    """Layer and model names are drawn as they are: a "$" starts no formula, a character the
    font lacks is a box (no warning, which the suite turns into an error), a line break a
    space."""
    report = _report(cnn_build, 3)
    report["model"] = "/models/$cost_{x.onnx"
    for layer, name in zip(report["layers"], ("a$b$c_{", "\u5c421", "two\nlines")):
        layer["name"] = name
    axes = cycle_figure(report).axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["a$b$c_{", "\u5c421",
                                                             "two lines"]
    assert axes.get_title().startswith("$cost_{x.onnx (sim): ")
    write_cycle_chart(report, tmp_path / "names.png")
    assert_not_blank(pixels(tmp_path / "names.png"), bars=3)
