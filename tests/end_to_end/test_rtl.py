"""Tier 2: compiled programs on the Verilator RTL, bit-exact with the golden model, with the
predicted cycle count equal to the simulated one. One cached RTL build per configuration."""

import numpy as np
import pytest

from hwonnx.api import BuildResult, first_difference, simulate
from hwonnx.compiler import lower, predict
from hwonnx.compiler.loops import normalized
from hwonnx.config import ArchConfig
from hwonnx.errors import MismatchError
from hwonnx.golden import evaluate
from hwonnx.sim import execute_rtl, rtl_build

from helpers import raises
from random_graphs import chain_graph, random_conv_spec, random_dense_spec

pytestmark = pytest.mark.rtl

CONFIGS = {
    "8x8": ArchConfig(),                     # the default: shared with the demo and examples
    # With the onnxruntime rounding unit (hdl/rounding.py), used here in its default rounding.
    "4x4": ArchConfig(rows=4, cols=4, act_depth=2048, wgt_depth=4096, acc_depth=16,
                      par_depth=64, prog_depth=2048, ort_rounding=True),
    # A narrow program memory: 8 words of 56 bits per instruction (hdl/fetch.py).
    "3x5": ArchConfig(rows=3, cols=5, act_depth=2048, wgt_depth=1024, acc_depth=64,
                      par_depth=64, prog_depth=2048, prog_width=56),
    # Two requantizers for six columns: each accumulator word in three passes (hdl/post.py).
    "4x6": ArchConfig(rows=4, cols=6, act_depth=2048, wgt_depth=1024, acc_depth=64,
                      par_depth=64, prog_depth=2048, post_lanes=2),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def config(request):
    config = CONFIGS[request.param]
    rtl_build(config)          # built once per configuration and cached on disk
    return config


def _run_and_check(graph, config, rng, samples=2):
    program = lower(graph, config)
    shape = program.input_placement.shape
    inputs = rng.integers(-128, 128, (samples,) + shape).astype(np.int8)
    got, run = execute_rtl(program, inputs, log=lambda message: None)
    want = evaluate(graph, {"x:q": inputs.reshape((-1,) + shape[1:])},
                    keep_all=True)[program.output_value]
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    predicted = predict(program.expanded(), config).total
    assert run.cycles == [predicted] * samples
    return program, run


@pytest.mark.parametrize("seed", range(6))
def test_random_conv_layer(config, seed):
    rng = np.random.default_rng(seed)
    spec = random_conv_spec(rng)
    graph = chain_graph(rng, [spec], (1, spec["cin"], spec["h"], spec["w"]))
    _run_and_check(graph, config, rng)


@pytest.mark.parametrize("seed", range(3))
def test_random_dense_layer(config, seed):
    rng = np.random.default_rng(100 + seed)
    spec = random_dense_spec(rng)
    graph = chain_graph(rng, [spec], (1, spec["cin"]))
    _run_and_check(graph, config, rng)


def test_multilayer_network(config):
    """Conv -> strided conv -> flatten -> dense -> dense: buffer allocation, layer hand-over
    (the wait on the post-processor) and, on the 4x4 config, tiling of the output pixels."""
    rng = np.random.default_rng(7)
    specs = [dict(op="conv", cout=6, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True),
             dict(op="conv", cout=9, k=(3, 3), strides=(2, 2), pads=(1, 0, 1, 0),
                  dilations=(1, 1), relu=True),
             dict(op="flatten"),
             dict(op="dense", cout=17, relu=True),
             dict(op="dense", cout=10, relu=False)]
    graph = chain_graph(rng, specs, (1, 5, 9, 8))
    program, _ = _run_and_check(graph, config, rng, samples=3)
    assert len(program.layers) == 4


def test_mismatch_names_first_differing_layer(config):
    """Co-verification: a corrupted weight of the third layer is reported there, not just as
    'outputs differ', by first_difference and by a compare run's MismatchError."""
    rng = np.random.default_rng(11)
    specs = [dict(op="conv", cout=4, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True), dict(op="flatten"),
             dict(op="dense", cout=12, relu=True), dict(op="dense", cout=7, relu=False)]
    graph = chain_graph(rng, specs, (1, 3, 4, 4))
    program = lower(graph, config)
    victim = next(i for i in program.expanded()
                  if i["op"] == 2 and i.layer == 2)["wgt_addr"]
    program.images["wgt"][victim] ^= 0x7F
    inputs = {"x": np.zeros((1,) + program.input_placement.shape, dtype=np.float32)}
    message = first_difference(BuildResult(None, graph, program, {}), inputs, 0,
                               log=lambda message: None)
    assert message.startswith("sample 0: layer 'layer3' (QDense) output differs first at")
    # and a compare run (hwonnx sim --mode compare) raises it, naming that layer
    with raises(MismatchError, f"RTL differs from the golden model: {message}"):
        simulate(BuildResult(None, graph, program, {}), inputs, mode="compare",
                 log=lambda message: None)


def test_cnn_operators(config):
    """Depthwise and grouped convolutions, average pooling with padding, a global average
    pool and a residual Add, as the MLPerf Tiny CNNs use them."""
    rng = np.random.default_rng(21)
    specs = [dict(op="conv", cout=6, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True),
             dict(op="conv", cout=6, k=(3, 3), strides=(2, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True, group=6),                  # depthwise
             dict(op="conv", cout=6, k=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                  dilations=(1, 1), relu=False, group=2),
             dict(op="add", **{"with": 1}),
             dict(op="avgpool", k=(2, 3), strides=(1, 2), pads=(1, 0, 0, 1)),
             dict(op="avgpool", k=(3, 3), strides=(1, 1), pads=(0, 0, 0, 0)),  # global
             dict(op="flatten"), dict(op="dense", cout=5, relu=False)]
    graph = chain_graph(rng, specs, (1, 4, 6, 7))
    assert graph.types["v5:q"].shape[2:] == (1, 1)
    program, _ = _run_and_check(graph, config, rng, samples=2)
    assert [layer.op for layer in program.layers] == [
        "QConv", "QConv", "QConv", "QAdd", "QAvgPool", "QAvgPool", "QDense"]


def test_max_pooling(config):
    """Max pooling with padding (read as -128), strides and dilation, an exact copy and a
    requantizing one, a global max pool; channels not a multiple of the array (N tiles
    aligned to the channel blocks when rows != cols)."""
    rng = np.random.default_rng(31)
    specs = [dict(op="conv", cout=7, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=False),
             dict(op="maxpool", k=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), identity=True),
             dict(op="maxpool", k=(2, 2), strides=(1, 1), pads=(0, 1, 1, 0), dilations=(1, 2)),
             dict(op="maxpool", k=(4, 3), strides=(1, 1), pads=(0, 0, 0, 0)),   # global
             dict(op="flatten"), dict(op="dense", cout=3, relu=False)]
    graph = chain_graph(rng, specs, (1, 5, 7, 8))
    assert graph.types["v3:q"].shape == (1, 7, 1, 1)
    program, _ = _run_and_check(graph, config, rng, samples=3)
    assert [layer.op for layer in program.layers] == [
        "QConv", "QMaxPool", "QMaxPool", "QMaxPool", "QDense"]


def test_activation_tables(config):
    """Layers whose outputs go through activation tables (random, so every entry matters):
    four different tables on conv, pooling, add and dense layers, the same table twice, and
    layers without one in between."""
    rng = np.random.default_rng(41)
    specs = [dict(op="conv", cout=6, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=False, table=True),
             dict(op="maxpool", k=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0), table=True),
             dict(op="conv", cout=6, k=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                  dilations=(1, 1), relu=True),
             dict(op="add", table=True, **{"with": 1}),
             dict(op="avgpool", k=(2, 2), strides=(1, 1), pads=(0, 0, 0, 0)),
             dict(op="flatten"), dict(op="dense", cout=9, relu=False, table=True)]
    graph = chain_graph(rng, specs, (1, 3, 6, 6))
    tables = [n.attrs["table"] for n in graph.nodes if "table" in n.attrs]
    assert len(set(tables)) == 4
    program, _ = _run_and_check(graph, config, rng, samples=3)
    assert len(program.images["lut"]) == 4 * 256
    assert [i["lut"] for i in program.expanded() if i["op"] == 3 and i.get("lut")]


def test_average_pooling_without_padding_in_the_divisor(config):
    """count_include_pad=0: each run of output pixels whose windows hold the same number of
    real pixels gets its own POST and parameter word (corners, edges, interior), also when an
    output tile (the small accumulators of 4x4 and 3x5) starts in the middle of a run."""
    rng = np.random.default_rng(51)
    specs = [dict(op="conv", cout=5, k=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                  dilations=(1, 1), relu=False),
             dict(op="avgpool", k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), exclude_pad=True),
             dict(op="avgpool", k=(3, 2), strides=(2, 1), pads=(2, 0, 1, 1), exclude_pad=True),
             dict(op="flatten"), dict(op="dense", cout=4, relu=False)]
    graph = chain_graph(rng, specs, (1, 3, 7, 6))
    program, _ = _run_and_check(graph, config, rng, samples=2)
    posts = [i for i in program.expanded() if i["op"] == 3 and i.layer == 1]
    n_tiles = len({(i["out_addr"] % i["out_stride"], i["lane_off"], i["nt"]) for i in posts})
    assert len({i["par_addr"] for i in posts}) == 3 * n_tiles      # window counts 4, 6, 9
    assert sum(i["count"] for i in posts) == 7 * 6 * n_tiles


def test_depthwise_streaming(config):
    """Depthwise convolutions in streaming mode (channels across the columns, kernel columns
    down the rows: MATMUL dw): strides along the stream (only every sx-th word writes),
    dilation, asymmetric padding, more channels than rows, output rows in several M tiles
    (4x4 and 3x5 have 8 and 32 accumulators per half), a streamed average pool; and the
    depthwise layers that keep the default mapping: a channel multiplier of 2, a kernel
    wider than the rows, a 1x1 kernel with a stride along the rows (slower streamed)."""
    rng = np.random.default_rng(61)
    c = 2 * config.rows + 1
    specs = [dict(op="conv", cout=c, k=(3, 3), strides=(1, 2), pads=(1, 0, 2, 1),
                  dilations=(1, 1), relu=True, group=c),
             dict(op="conv", cout=c, k=(2, 2), strides=(2, 1), pads=(1, 1, 1, 1),
                  dilations=(2, 2), relu=False, group=c),
             dict(op="avgpool", k=(2, 2), strides=(2, 1), pads=(0, 1, 1, 0)),
             dict(op="conv", cout=2 * c, k=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                  dilations=(1, 1), relu=False, group=c),                 # multiplier 2
             dict(op="conv", cout=2 * c, k=(1, config.rows + 1), strides=(1, 1),
                  pads=(0, config.rows // 2, 0, config.rows // 2), dilations=(1, 1),
                  relu=False, group=2 * c),                                # too wide
             dict(op="conv", cout=2 * c, k=(1, 1), strides=(1, 2), pads=(0, 0, 0, 0),
                  dilations=(1, 1), relu=False, group=2 * c),              # 1x1, stride 2
             dict(op="flatten"), dict(op="dense", cout=3, relu=False)]
    graph = chain_graph(rng, specs, (1, c, 9, 13))
    program, _ = _run_and_check(graph, config, rng, samples=2)
    streamed = {i.layer for i in program.expanded() if i.get("dw")}
    assert streamed == {0, 1, 2}


def test_depthwise_streaming_applies_several_kernel_rows_per_pass(config):
    """On a narrow image one streamed pass applies several kernel rows: weight row ``D*t + kx``
    meets stream row ``t`` below (``D`` words per stream row, ``D*(T - 1) + KW <= rows``), a
    tap past the end of a row lands on the next row's left padding, and each pass streams
    rows past its last output row. Kernel rows grouped by stride and dilation, the tails of
    a 3x3 pad-1 kernel, a strided average pool; the passes per output tile as the geometry
    says for each array (``T`` = 2 or 4 on 8 rows, 1 or 2 on 4 and 3)."""
    rng = np.random.default_rng(62)
    c = config.rows + 1
    specs = [dict(op="conv", cout=c, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True, group=c),                  # D 3, tail 1
             dict(op="conv", cout=c, k=(3, 1), strides=(1, 1), pads=(1, 0, 1, 0),
                  dilations=(1, 1), relu=False, group=c),                 # D 2
             dict(op="conv", cout=c, k=(3, 1), strides=(2, 1), pads=(1, 0, 1, 0),
                  dilations=(1, 1), relu=False, group=c),                 # rows {0, 2}, {1}
             dict(op="conv", cout=c, k=(2, 1), strides=(1, 1), pads=(1, 0, 1, 0),
                  dilations=(2, 1), relu=False, group=c),                 # rows 0, 2 apart
             dict(op="avgpool", k=(3, 3), strides=(1, 2), pads=(1, 1, 1, 1)),
             dict(op="flatten"), dict(op="dense", cout=3, relu=False)]
    graph = chain_graph(rng, specs, (1, c, 9, 2))
    program, _ = _run_and_check(graph, config, rng, samples=2)
    matmuls = [i for i in program.expanded() if i["op"] == 2]
    passes = [sum(1 for i in matmuls if i.layer == layer) //
              sum(1 for i in matmuls if i.layer == layer and i["first"])
              if any(i.get("dw") for i in matmuls if i.layer == layer) else None
              for layer in range(5)]
    # on 4 and 3 rows the dilated layer's two passes cost what its two taps cost, and on 4x4
    # (8 accumulators a half) the pool's 3 passes what its 9 taps cost: not streamed
    assert passes == {"8x8": [2, 1, 2, 1, 2], "4x4": [3, 2, 2, None, None],
                      "3x5": [3, 2, 2, None, 3], "4x6": [3, 2, 2, None, 3]}[config.name]


def test_looped_and_explicit_programs_agree(config):
    """The same network stored looped (three instructions per layer, expanded by the tile
    walker) and explicitly (one micro-instruction per stored word): both equal golden, each
    takes exactly its predicted cycles, and the engines see the same micro-instructions."""
    rng = np.random.default_rng(21)
    specs = [dict(op="conv", cout=7, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True),
             dict(op="conv", cout=9, k=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True, group=1), dict(op="flatten"),
             dict(op="dense", cout=11, relu=False)]
    graph = chain_graph(rng, specs, (1, 5, 9, 9))
    inputs = rng.integers(-128, 128, (2, 1, 5, 9, 9)).astype(np.int8)
    want = evaluate(graph, {"x:q": inputs.reshape((-1, 5, 9, 9))}, keep_all=True)
    outputs = []
    for loops in (True, False):
        program = lower(graph, config, loops=loops)
        # on 4x4 (8 accumulators per half) the first layer's 9-pixel rows do not fit an output
        # tile, so it stays explicit and the program mixes both forms
        looped = [i["op"] for i in program.instructions].count(6)
        assert looped == (len(program.layers) - (config.acc_half < 9) if loops else 0)
        got, run = execute_rtl(program, inputs, log=lambda message: None)
        expected = want[program.output_value]
        np.testing.assert_array_equal(got.reshape(expected.shape), expected)
        assert run.cycles == [predict(program.expanded(), config).total] * 2
        outputs.append([normalized(i) for i in program.expanded() if i["op"] in (1, 2, 3)])
    assert outputs[0] == outputs[1]


def test_low_bit_weights_are_packed(config):
    """Layers of 4-bit and 2-bit weights are stored two and four per lane byte (a tile of
    ``ceil(rows / 2)`` and ``ceil(rows / 4)`` words; on 3 rows a tile's last word is half
    empty) and unpacked by the loader, looped and explicit, bit-exact in the predicted cycles;
    the 8-bit layer between them keeps one weight per byte."""
    rng = np.random.default_rng(23)
    specs = [dict(op="conv", cout=7, k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True, wbits=4, gain=8),
             dict(op="conv", cout=6, k=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                  dilations=(1, 1), relu=True, wbits=8),
             dict(op="conv", cout=5, k=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
                  dilations=(1, 1), relu=True, wbits=2, gain=32), dict(op="flatten"),
             dict(op="dense", cout=9, relu=False, wbits=3, gain=8)]
    graph = chain_graph(rng, specs, (1, 5, 7, 7))
    inputs = rng.integers(-128, 128, (2, 1, 5, 7, 7)).astype(np.int8)
    want = evaluate(graph, {"x:q": inputs.reshape((-1, 5, 7, 7))}, keep_all=True)
    rows = config.rows
    for loops in (True, False):
        program = lower(graph, config, loops=loops)
        assert [layer.wgt_bits for layer in program.layers] == [4, 8, 2, 4]
        tiles = [layer.wgt_words // layer.tiles if layer.op == "QDense" else None
                 for layer in program.layers]
        assert tiles[-1] == -(-rows // 2)
        loads = {i.layer: i["wpack"] for i in program.expanded() if i["op"] == 1}
        assert loads == {0: 1, 1: 0, 2: 2, 3: 1}
        got, run = execute_rtl(program, inputs, log=lambda message: None)
        expected = want[program.output_value]
        np.testing.assert_array_equal(got.reshape(expected.shape), expected)
        assert len(np.unique(expected)) > 4           # the outputs are not saturated
        assert run.cycles == [predict(program.expanded(), config).total] * 2
