"""The wheel holds only the ``hwonnx`` package and its data, with the card's top-level
folders (hdl/, sim/, boards/) installed under ``hwonnx.``."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contents(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True)
    wheel, = tmp_path.glob("hwonnx-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"hwonnx", next(t for t in tops if t.endswith(".dist-info"))}
    for required in ("hwonnx/hdl/top.py", "hwonnx/sim/tb_accel.py", "hwonnx/sim/runner.py",
                     "hwonnx/boards/__init__.py", "hwonnx/examples/digits_mlp.onnx",
                     "hwonnx/examples/digits_cnn.onnx", "hwonnx/examples/digits_data.npz",
                     "hwonnx/cli.py"):
        assert required in names, required
    assert not any(name.startswith(("tests/", "bench/")) for name in names)
