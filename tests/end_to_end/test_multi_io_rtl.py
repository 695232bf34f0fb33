"""Several inputs and outputs on the Verilator RTL: two inputs joined by a Concat (each with
its own steps on the host first) or by a residual Add, an autoencoder returning its code (also
read by the decoder) and its reconstruction, a two-head network whose intermediate feature
map is an output read further on (a Softmax on one head and an ArgMax on another, on the
host), two inputs added directly, an output beside its own Flatten. Every output equals
golden bit for bit, every layer too, and the simulated cycles equal the prediction; ``hwonnx
sim --compare`` takes an .npz of two inputs and writes every output."""

import numpy as np
import pytest

from hwonnx.api import build, first_difference, simulate
from hwonnx.cli import main
from hwonnx.config import ArchConfig

from multi_io_models import (MODELS, inputs_added, map_and_flattened, samples,
                             two_images_concat)
from helpers import quiet

pytestmark = pytest.mark.rtl

#: The 8x8 default and the 3x5 configuration of tests/operators/test_concat_rtl.py (cached
#: Verilator builds): on 3 rows an input of 2 or 3 channels fills its words, of 5 it does not.
CONFIGS = {
    "8x8": ArchConfig(),
    "3x5": ArchConfig(rows=3, cols=5, act_depth=2048, wgt_depth=1024, acc_depth=64,
                      par_depth=64, prog_depth=2048),
}
VARIANTS = {**MODELS, "two_images_concat_host": lambda rng: two_images_concat(rng, host=True),
            "inputs_added": inputs_added, "map_and_flattened": map_and_flattened}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rtl_equals_golden_on_every_output(name, config_name):
    rng = np.random.default_rng(sorted(VARIANTS).index(name))
    model, shapes = VARIANTS[name](rng)
    result = build(model, None, calib=samples(rng, shapes, 64), config=CONFIGS[config_name],
                   log=quiet)
    program = result.program
    assert len(program.inputs) + len(program.outputs) >= 3
    count = 4
    x = samples(rng, shapes, count)
    rtl = simulate(result, x, mode="rtl", log=quiet)
    golden = simulate(result, x, mode="golden")
    assert list(rtl.int_values) == [p.value for p in program.outputs]
    for value, want in golden.int_values.items():
        np.testing.assert_array_equal(rtl.int_values[value], want)
    for output, want in golden.outputs.items():
        np.testing.assert_array_equal(rtl.outputs[output], want)
    assert rtl.cycles == [rtl.predicted_cycles] * count
    # every layer's output equals golden too (programs truncated after each layer)
    assert first_difference(result, x, count - 1, log=quiet) == (
        f"sample {count - 1}: every layer output matches; the difference is in the host I/O")
    print(f"\n{name} on {config_name}: {len(program.inputs)} input(s), {len(program.outputs)} "
          f"output(s), {len(program.layers)} layers, {rtl.predicted_cycles} cycles")


def test_cli_sim_compare_with_an_npz_of_two_inputs(tmp_path, capsys):
    rng = np.random.default_rng(0)
    model, shapes = two_images_concat(rng, host=True)
    out = tmp_path / "out"
    build(model, out, calib=samples(rng, shapes, 64), log=quiet)
    x = samples(rng, shapes, 3)
    np.savez(tmp_path / "x.npz", **x)
    assert main(["sim", str(out), "--input", str(tmp_path / "x.npz"), "--compare",
                 "--output", str(tmp_path / "y.npz")]) == 0
    printed = capsys.readouterr().out
    golden = simulate(out, x, mode="golden")
    assert f"3 sample(s) on RTL: {golden.predicted_cycles:,} cycles per sample (predicted " \
           f"{golden.predicted_cycles:,})" in printed
    assert "RTL equals the golden model bit for bit" in printed
    with np.load(tmp_path / "y.npz") as npz:
        assert npz.files == ["y"]
        np.testing.assert_array_equal(npz["y"], golden.outputs["y"])
