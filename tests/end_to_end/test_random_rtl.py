"""Randomized RTL tier: random layers and random networks, drawn by Hypothesis
(``random_graphs.layer_cases`` / ``graph_cases``), compiled for the four architectures of
``test_rtl.py`` and run on Verilator. Every case asserts that the RTL output equals the golden
model's bit for bit and that every sample took exactly the predicted cycles.

Tiers: the default run draws a small seeded sample (40 cases); ``pytest -m slow`` runs 1,440
cases (800 single layers, 640 networks of 2-6 layers) in 64 test items (seed blocks) that
pytest-xdist spreads over its workers. Each seed block is one Hypothesis run with an explicit
seed and no example database, so every run draws the same cases; a failure is shrunk to a
minimal case, printed with a snippet that rebuilds its graph.

Each RTL run has a fixed start-up cost (about 1.5 s), so every case runs its samples (random,
extreme and constant inputs) back to back in one simulation. A case the compiler refuses for
the size of the architecture's buffers or its number of activation tables (``ResourceError``)
is rejected and not counted; a block asserts that most of its cases ran.

With ``HWONNX_RELIABILITY_LOG=<file>`` each block appends a JSON line of its counts (cases,
array layers, operators, samples, rejections) for the figures in ``docs/testing.md``."""

import json
import os
import zlib
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, reject, seed, settings

from hwonnx.compiler import lower, predict
from hwonnx.errors import ResourceError
from hwonnx.golden import evaluate
from hwonnx.isa import Op
from hwonnx.sim import execute_rtl, rtl_build

from random_graphs import chain_graph, graph_cases, layer_cases
from tests.end_to_end.test_rtl import CONFIGS

pytestmark = pytest.mark.rtl

SAMPLES = 3                 # per case, in one simulation run
#: (cases per block, blocks per configuration) of each kind and tier. 4 configurations:
#: default 4 x (2 x 3 + 2 x 2) = 40 cases; slow 4 x (8 x 25 + 8 x 20) = 1,440 cases.
DEFAULT = {"layer": (3, 2), "graph": (2, 2)}
SLOW = {"layer": (25, 8), "graph": (20, 8)}


def _quiet(message):
    pass


def _inputs(rng, shape, in_zp: int) -> np.ndarray:
    """Random, extreme (-128 / 127 only) and constant (the input zero point) samples."""
    samples = [rng.integers(-128, 128, shape),
               rng.choice(np.array([-128, 127]), shape),
               np.full(shape, in_zp)]
    return np.stack(samples[:SAMPLES]).astype(np.int8)


def _reproducer(kind: str, config_name: str, specs, shape, data_seed: int) -> str:
    return (f"# {kind} case on {config_name}; to reproduce, run in the repository's root, "
            f"with PYTHONPATH=tests:\n"
            f"from collections import Counter\n"
            f"from tests.end_to_end.test_random_rtl import CONFIGS, check_case\n"
            f"check_case(CONFIGS[{config_name!r}], {specs!r}, {shape!r}, {data_seed}, "
            f"Counter())")


def check_case(config, specs, shape, data_seed: int, stats: Counter) -> None:
    """Compile the case, run its samples on the RTL in one simulation, compare with golden
    bit for bit and the cycles with the prediction. Raises ``ResourceError`` if the case does
    not fit ``config``."""
    graph = chain_graph(np.random.default_rng(data_seed), specs, shape)
    program = lower(graph, config)
    in_zp = graph.nodes[0].attrs["zero_point"]
    inputs = _inputs(np.random.default_rng(data_seed), program.input_placement.shape, in_zp)
    got, run = execute_rtl(program, inputs, log=_quiet)
    want = evaluate(graph, {"x:q": inputs.reshape((-1,) + program.input_placement.shape[1:])},
                    keep_all=True)[program.output_value]
    stats["samples"] += len(inputs)
    if not np.array_equal(got.reshape(want.shape), want):
        stats["mismatches"] += 1
    predicted = predict(program.expanded(), config).total
    if run.cycles != [predicted] * len(inputs):
        stats["cycle_mismatches"] += 1
    np.testing.assert_array_equal(got.reshape(want.shape), want,
                                  err_msg="RTL output differs from the golden model")
    assert run.cycles == [predicted] * len(inputs), \
        f"simulated cycles {run.cycles}, predicted {predicted}"
    stats["cases"] += 1
    stats["layers"] += len(program.layers)
    stats["streamed"] += len({i.layer for i in program.expanded() if i.get("dw")})
    stats["looped"] += sum(i["op"] == Op.LOOP for i in program.instructions)
    for spec in specs:
        grouped = spec["op"] == "conv" and spec.get("group", 1) > 1
        stats["op:" + ("grouped/depthwise conv" if grouped else spec["op"])] += 1


def run_block(kind: str, config_name: str, tier: str, block: int, examples: int) -> Counter:
    """One Hypothesis run of ``examples`` cases with a seed of its own."""
    config = CONFIGS[config_name]
    rtl_build(config, log=_quiet)          # built once per configuration and cached on disk
    block_seed = zlib.crc32(f"{kind}/{config_name}/{tier}/{block}".encode())
    make = layer_cases if kind == "layer" else graph_cases
    strategy = make(ort_rounding=config.ort_rounding, first_kind=block)
    stats = Counter()

    @seed(block_seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              phases=(Phase.explicit, Phase.generate, Phase.shrink),
              suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much),
              print_blob=False)
    @given(case=strategy)
    def random_case(case):
        specs, shape, data_seed = case
        note(_reproducer(kind, config_name, specs, shape, data_seed))
        try:
            check_case(config, specs, shape, data_seed, stats)
        except ResourceError as error:
            # The case does not fit this architecture's buffers or activation tables.
            stats["rejected"] += 1
            note(f"refused: {error}")
            reject()

    random_case()
    # Rejected cases do not count toward max_examples; Hypothesis stops by itself only when
    # too many are rejected, so every block runs its cases unless it found a failure.
    assert stats["cases"] >= examples, stats
    log = os.environ.get("HWONNX_RELIABILITY_LOG")
    if log:
        with open(log, "a") as stream:
            stream.write(json.dumps({"kind": kind, "config": config_name, "tier": tier,
                                     "block": block, "seed": block_seed, **stats}) + "\n")
    return stats


def _blocks(sizes: dict, kind: str):
    per_block, blocks = sizes[kind]
    return [(name, block, per_block) for name in sorted(CONFIGS) for block in range(blocks)]


@pytest.mark.parametrize("config_name,block,examples", _blocks(DEFAULT, "layer"))
def test_random_layers(config_name, block, examples):
    run_block("layer", config_name, "default", block, examples)


@pytest.mark.parametrize("config_name,block,examples", _blocks(DEFAULT, "graph"))
def test_random_graphs(config_name, block, examples):
    run_block("graph", config_name, "default", block, examples)


@pytest.mark.slow
@pytest.mark.parametrize("config_name,block,examples", _blocks(SLOW, "layer"))
def test_random_layers_slow(config_name, block, examples):
    run_block("layer", config_name, "slow", block, examples)


@pytest.mark.slow
@pytest.mark.parametrize("config_name,block,examples", _blocks(SLOW, "graph"))
def test_random_graphs_slow(config_name, block, examples):
    run_block("graph", config_name, "slow", block, examples)



def test_vector_add_of_differently_placed_sources():
    """Found by the slow tier (shrunk): a residual Add of a Gemm output and a Flatten of an
    image, two vectors placed in different lanes. The compiler laid out the second source's
    weights with the first source's lanes, so the RTL read the wrong lane (RTL 30, golden 47)
    and plain `sim` gave a wrong answer."""
    from onnx import TensorProto, helper, numpy_helper

    from hwonnx.api import build, simulate

    node = helper.make_node
    graph = helper.make_graph(
        [node("Conv", ["x", "w"], ["c"]), node("Flatten", ["c"], ["f"]),
         node("Gemm", ["f", "g"], ["m"]), node("Add", ["m", "f"], ["y"])], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w"),
         numpy_helper.from_array(np.array([[.5, -1], [2, .25]], np.float32), "g")])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(0)
    result = build(model, None, calib={"x": rng.uniform(-1, 1, (16, 1, 1, 1, 2)).astype(
        np.float32)}, verilog=False, log=_quiet)
    inputs = {"x": rng.uniform(-1, 1, (4, 1, 1, 1, 2)).astype(np.float32)}
    rtl = simulate(result, inputs, mode="compare", log=_quiet)     # raises on any difference
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [golden.predicted_cycles] * 4
