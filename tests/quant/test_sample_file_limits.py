"""Sample files against the memory they take (issue 35): a 2 MB ``.npz`` holding a 2 GiB
array of zeros passed the limit of 2^30 values and then took 15 GB in ``sim --golden``. The
limit is now 2^28 values (1 GiB as float32, which the samples become) and 1 GiB of data as
stored, read from the array's header before anything is decompressed; and the golden model
runs the samples in blocks, so that its memory does not grow with them."""

import subprocess
import sys
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npy_format
from onnx import helper

from hwonnx import api
from hwonnx.cli import main
from hwonnx.quant.data import MAX_SAMPLE_BYTES, MAX_SAMPLE_VALUES
from spec_helpers import make_model, rand


def mlp():
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2")]
    inits = {"w1": rand(16, 8) * 0.3, "b1": rand(8, seed=1) * 0.1,
             "w2": rand(8, 3, seed=2) * 0.3, "b2": rand(3, seed=3) * 0.1}
    return make_model(nodes, {"x": [1, 16]}, {"y": [1, 3]}, inits)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("limits") / "out"
    api.build(mlp(), out, calib={"x": rand(32, 16, seed=4)}, verilog=False, log=lambda *_: None)
    return out


def zeros_npz(path, name: str, dtype: str, shape) -> None:
    """An .npz whose member ``name`` holds zeros of ``dtype`` and ``shape``, compressed (a few
    MB for gigabytes), written a block at a time."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open(f"{name}.npy", "w", force_zip64=True) as stream:
            npy_format.write_array_header_1_0(stream, {"descr": dtype, "fortran_order": False,
                                                       "shape": shape})
            left, block = int(np.prod(shape)) * np.dtype(dtype).itemsize, bytes(1 << 24)
            while left:
                stream.write(block[:min(left, len(block))])
                left -= min(left, len(block))


def sim_error(capsys, build, path) -> str:
    code = main(["sim", str(build), "--input", str(path), "--golden"])
    out, err = capsys.readouterr()
    assert (code, out.count("\n") <= 1, "Traceback" in err) == (2, True, False), err
    return err


def test_small_npz_of_2_gib_of_float32_is_refused(build, tmp_path, capsys):
    path = tmp_path / "x.npz"
    zeros_npz(path, "x", "<f4", (1 << 25, 16))                       # 2 GiB, 2^29 values
    assert path.stat().st_size < 16 << 20
    assert sim_error(capsys, build, path).endswith(
        f"hwonnx: error: Input file '{path}' (array 'x') holds an array of shape "
        f"({1 << 25}, 16): more than the {MAX_SAMPLE_VALUES:,} values a sample file may "
        f"hold\n")


def test_small_npz_of_2_gib_of_float64_is_refused(build, tmp_path, capsys):
    """2^28 float64 values: within the values, but 2 GiB as stored."""
    path = tmp_path / "x.npz"
    zeros_npz(path, "x", "<f8", (1 << 24, 16))
    assert path.stat().st_size < 16 << 20
    assert sim_error(capsys, build, path).endswith(
        f"hwonnx: error: Input file '{path}' (array 'x') holds an array of shape "
        f"({1 << 24}, 16) and dtype float64 ({2 << 30:,} bytes): more than the "
        f"{MAX_SAMPLE_BYTES:,} bytes a sample file may hold\n")


def test_golden_model_in_blocks_equals_each_sample_alone(build, monkeypatch):
    xs = rand(40, 16, seed=6)
    loaded = api.load_build(build)
    monkeypatch.setattr("hwonnx.run.GOLDEN_BLOCK_VALUES", 1)   # one sample per block
    blocks = api.run_golden(loaded, {"x": xs})
    for i in range(len(xs)):
        alone = api.run_golden(loaded, {"x": xs[i:i + 1]})
        np.testing.assert_array_equal(blocks.outputs["y"][i:i + 1], alone.outputs["y"])


CHILD = """
import resource, sys
import numpy as np
from hwonnx import api
build = api.load_build(sys.argv[1])
xs = np.zeros((int(sys.argv[2]), 16), np.float32)
api.simulate(build, {"x": xs[:1]}, mode="golden")              # every import made
with open("/proc/self/statm") as stream:
    in_use = int(stream.read().split()[0]) * resource.getpagesize()
cap = in_use + 3 * xs.nbytes + (96 << 20)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
result = api.simulate(build, {"x": xs}, mode="golden")
assert result.outputs["y"].shape == (len(xs), 3)
print("ok")
"""


def test_golden_run_takes_memory_in_proportion_to_its_inputs(build):
    """128 MiB of samples: at most three times that (the samples, their float32 copy and the
    int8 results) plus a fixed amount; at once, the golden model took eight times."""
    result = subprocess.run([sys.executable, "-c", CHILD, str(build), str(1 << 21)],
                            capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr[-2000:]

