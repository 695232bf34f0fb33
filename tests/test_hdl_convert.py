"""hdl/convert.py: the accelerator's Verilog in seconds. Memories with initial contents are
rendered exactly as Amaranth renders them; all-zero ones get none (the accelerator never
reads a word it has not written: every RTL test checks that against the golden model)."""

import re

from amaranth.back import rtlil

from hwonnx.config import ArchConfig
from hwonnx.hdl import Accelerator
from hwonnx.hdl.convert import fast_memories

CONFIG = ArchConfig(rows=3, cols=5, act_depth=64, wgt_depth=32, prog_depth=16, par_depth=8,
                    acc_depth=8, lut_tables=1)
IMAGES = {"wgt": [(i * 12345) % (1 << 15) for i in range(20)], "prog": [7, 1 << 300],
          "par": [1, 2, 3], "lut": list(range(256))}


def _cells(text: str) -> "dict[str, str]":
    """The ``$meminit_v2`` cells of an RTLIL text, by memory id (cell numbers left out)."""
    cells = re.findall(r"cell \$meminit_v2 \$\d+\n(.*?\n  end\n)", text, re.S)
    return {re.search(r'parameter \\MEMID "([^"]+)"', c).group(1): c for c in cells}


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
