"""The wheel holds only the ``hwonnx`` package and its data, with the card's top-level
folders (hdl/, sim/, boards/) installed under ``hwonnx.``, and works outside the repository."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = {"hwonnx": ROOT / "hwonnx", "hwonnx/hdl": ROOT / "hdl",
                "hwonnx/sim": ROOT / "sim", "hwonnx/boards": ROOT / "boards"}


def _packages() -> "list[str]":
    """Every package of the source tree, as the installed path it must have."""
    found = []
    for installed, source in SOURCE_ROOTS.items():
        for init in source.rglob("__init__.py"):
            relative = init.parent.relative_to(source)
            found.append("/".join(filter(None, [installed, *relative.parts])))
    return found


def test_wheel_contents_and_import_outside_the_repository(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True)
    wheel, = tmp_path.glob("hwonnx-*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"hwonnx", next(t for t in tops if t.endswith(".dist-info"))}
    for package in _packages():
        assert f"{package}/__init__.py" in names, f"package {package} missing from the wheel"
    for required in ("hwonnx/sim/tb_system.py", "hwonnx/examples/digits_mlp.onnx",
                     "hwonnx/examples/digits_cnn.onnx", "hwonnx/examples/digits_data.npz"):
        assert required in names, required

    # Import every module from the unpacked wheel, with the repository off sys.path.
    site = tmp_path / "site"
    archive.extractall(site)
    modules = sorted(name[:-3].replace("/", ".").removesuffix(".__init__") for name in names
                     if name.endswith(".py") and not name.endswith("train_digits.py"))
    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
            "[importlib.import_module(m) for m in sys.argv[2:]]; "
            "import hwonnx; assert hwonnx.__file__.startswith(sys.argv[1]), hwonnx.__file__")
    subprocess.run([sys.executable, "-c", code, str(site), *modules], check=True,
                   cwd=tmp_path, capture_output=True)
