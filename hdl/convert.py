"""Verilog of the accelerator in seconds, whatever its buffer depths.

Amaranth 0.5 writes the initial contents of a memory into RTLIL one bit at a time, a Python
object per bit, and Yosys then writes one Verilog line per word (amaranth-lang/amaranth#1522):
the buffers of an MLPerf-sized 16x16 accelerator hold tens of millions of bits, and its
conversion took ten minutes. Under :func:`fast_memories`:

- a memory whose initial contents are all zero gets no initial contents at all. The
  accelerator never reads a word it has not written (the host loads the program, weights,
  parameters and inputs; a MATMUL with ``first`` overwrites its accumulators; lanes a POST
  does not write meet zero weights), and block RAM without initial contents powers up as
  zero on every FPGA family and in Verilator;
- any other is rendered from the rows' integers, character for character the RTLIL Amaranth
  writes (``tests/test_hdl_convert.py`` compares them).

Every conversion of hwonnx (:func:`verilog`, the board builds) runs under it.
"""

import contextlib
import threading

from amaranth.back import rtlil
from amaranth.back import verilog as amaranth_verilog
from amaranth.hdl import _nir

__all__ = ["fast_memories", "verilog"]

_lock = threading.Lock()


def _emit_memory(self, cell_idx, cell):
    """``ModuleEmitter.emit_memory`` of Amaranth 0.5 with the init constant built as text."""
    if not any(cell.init):
        return
    memory_info = self.memories[cell_idx]
    mask = (1 << cell.width) - 1
    bits = "".join(format(row & mask, f"0{cell.width}b") for row in reversed(cell.init))
    self.builder.cell("$meminit_v2", ports={
        "ADDR": self.sigspec(),
        "DATA": f"{len(bits)}'{bits}" if bits else self.sigspec(),
        "EN": self.sigspec(_nir.Value.ones(cell.width)),
    }, parameters={
        "MEMID": memory_info.memid,
        "ABITS": 0,
        "WIDTH": cell.width,
        "WORDS": cell.depth,
        "PRIORITY": 0,
    }, src_loc=cell.src_loc)


@contextlib.contextmanager
def fast_memories():
    """Within the block, Amaranth renders memory initial contents as text (see the module)."""
    with _lock:
        original = rtlil.ModuleEmitter.emit_memory
        rtlil.ModuleEmitter.emit_memory = _emit_memory
        try:
            yield
        finally:
            rtlil.ModuleEmitter.emit_memory = original


def verilog(component, name: str) -> str:
    """``amaranth.back.verilog.convert(component, name=name)``, fast (:func:`fast_memories`)."""
    with fast_memories():
        return amaranth_verilog.convert(component, name=name)
