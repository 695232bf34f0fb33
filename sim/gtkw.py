"""The GTKWave save file of a trace (``out.gtkw`` beside ``out.vcd`` or ``out.fst``).

It groups the key signals by engine (:data:`ENGINES`), names only signals the Verilog of the
traced build declares (:func:`declared_signals`), as GTKWave names them
(:func:`gtkwave_name`), and places the primary marker at the first sample's start and the
markers A, B, ... at the first cycle of each layer (the report's ``cycle_window``);
``out.ops.txt``, a translate filter file, shows the opcode of the dispatched instruction by
name.
"""

import math
import re
from itertools import count, takewhile
from pathlib import Path

from ..isa import Op
from .harness import HARNESS_TOP
from .trace import trace_kind

__all__ = ["ENGINES", "INTEGER", "CLOCK_PERIOD_NS", "UNITS_PER_NS", "declared_signals",
           "gtkwave_name", "save_groups", "save_file", "opcode_filter", "write_save_file"]

#: The harness's clock period (``always #5 clk = ~clk``).
CLOCK_PERIOD_NS = 10
#: Time units of a dump per ns: its timescale is the simulation's precision, 1 ps (the
#: runner's ``timescale=("1ns", "1ps")``).
UNITS_PER_NS = 1000

#: The save file's groups: name, the scope below the harness (``accel``: the accelerator),
#: and the signals in it; ``name[*]`` stands for ``name[0]``, ``name[1]``, ... (a lane or a
#: column each). A signal the build does not declare (an engine the architecture lacks, the
#: narrow fetch unit's signals with a wide program memory and the other way round) is left
#: out.
ENGINES = (
    ("accelerator", "accel", ("host__start", "host__busy", "host__done", "host__cycles",
                              "debug_dispatched", "debug_busy")),
    ("instruction fetch", "accel", ("running", "fire", "fetched_fire")),
    ("dispatcher", "accel.dispatcher", ("instr__valid", "instr__ready", "instr__payload.op",
                                        "instr__payload.count", "post_idle", "blocked",
                                        "pend_valid", "accepted", "posts_done")),
    ("program fetch", "accel.fetch", ("valid", "mem_en", "mem_addr", "ptr", "arriving",
                                      "waiting", "instr__valid", "instr__ready")),
    ("tile walker", "accel.walker", ("instr__valid", "load", "instr__ready",
                                     "instr__payload.op")),
    ("weight loader", "accel.loader", ("instr__valid", "busy", "bank", "row", "wgt__addr",
                                       "wload_en", "wload_bank", "wload_row")),
    ("feeder", "accel.feeder", ("instr__valid", "pending", "running", "drained", "remaining",
                                "act_en", "act_addr", "feed_bank", "feed_pad", "acc_we",
                                "acc_waddr", "completed")),
    ("array", "accel.array", ("wload_en", "wload_bank", "wload_row", "feed_bank", "feed[*]",
                              "sums[*]")),
    ("post-processor", "accel.post", ("instr__valid", "idle", "active", "remaining", "acc_addr",
                                      "par__addr", "out_we", "out_addr", "out_data[*]")),
    ("element-wise engine", "accel.eltw", ("instr__valid", "idle", "active", "remaining", "act_en",
                                           "act_addr", "acc_we", "acc_addr")),
    ("DMA engine", "accel.dma", ("instr__valid", "idle", "slot_free", "ext__cmd_valid",
                                 "ext__cmd_ready", "ext__cmd_addr", "ext__cmd_len",
                                 "ext__rvalid", "ext__wr_valid", "ext__wr_ready", "wgt_we",
                                 "wgt_addr", "act_we", "act_ren")),
    ("external memory", "ext_memory", ("port__cmd_valid", "port__cmd_ready", "port__rvalid",
                                       "port__wr_valid", "port__wr_ready")),
    ("harness", "", ("sample",)),
)
#: Signals shown in decimal (counters, addresses people count in) and signed decimal (data).
_DECIMAL = {"host__cycles", "debug_dispatched", "instr__payload.count", "remaining", "row",
            "accepted", "completed", "sample", "wgt_addr", "act_addr", "acc_addr", "acc_waddr",
            "par_addr", "out_addr", "mem_addr", "ptr", "wload_row", "ext__cmd_addr",
            "ext__cmd_len", "wgt__addr", "par__addr"}
_SIGNED = {"feed", "sums", "out_data"}
#: GTKWave's flags: right-justified names (0x20) with hex 0x2, decimal 0x4, binary 0x8 or
#: signed decimal 0x400 values; translated by a filter file 0x2000; group begin and end.
_FLAGS = {"hex": "22", "dec": "24", "bin": "28", "signed": "420", "ops": "2022"}
_GROUP_BEGIN, _GROUP_END = "800200", "1000200"
#: The range :func:`declared_signals` gives an ``integer``.
INTEGER = "integer"
#: The save file's window size in pixels.
_SIZE = (1400, 900)


_MODULE = re.compile(r"^module\s+\\?(\S+?)\s*\((.*?)^endmodule", re.M | re.S)
_DECLARATION = re.compile(r"^\s*(input|output|inout|wire|reg|integer)\b\s*(?:signed\s+)?"
                          r"(?:\[([-+*\d ]+):([-+*\d ]+)\])?\s*([^;]*);", re.M)
_INSTANCE = re.compile(r"^\s*\\?(\S+)\s+(\w+)\s*\(", re.M)


def declared_signals(*sources: str, top: str = HARNESS_TOP) -> "dict[tuple[str, str], str]":
    """Every signal the Verilog ``sources`` declare in the hierarchy under module ``top``:
    ``(scope, name)`` (the scope: the instance names from ``top`` joined by ``.``, e.g.
    ``hwonnx_harness.accel``; the name as declared, e.g. ``instr.op``) -> its bit range
    (``"[3:0]"``; ``""`` for one bit; :data:`INTEGER` for an ``integer``). Memories (arrays)
    are left out."""
    modules = {name: body for text in sources for name, body in _MODULE.findall(text)}
    signals: "dict[tuple[str, str], str]" = {}

    def walk(module: str, scope: str) -> None:
        body = modules[module]
        for kind, msb, lsb, names in _DECLARATION.findall(body):
            bits = INTEGER if kind == "integer" else f"[{_value(msb)}:{_value(lsb)}]" \
                if msb else ""
            for item in names.split(","):
                match = re.match(r"\s*(?:\\(\S+)|([A-Za-z_][\w$]*))\s*(\[|=|$)", item)
                if match and match.group(3) != "[":         # not a memory
                    name = match.group(1) or match.group(2)
                    signals[scope, name] = bits
        for module_type, instance in _INSTANCE.findall(body):
            if module_type in modules:
                walk(module_type, f"{scope}.{instance}")

    walk(top, top)
    return signals


def _value(expression: str) -> int:
    """The value of a range bound: a number, or a constant sum of products of the harness
    (``24-1``, ``8*1024-1``)."""
    return sum((-1 if sign == "-" else 1) * math.prod(int(f) for f in term.split("*"))
               for sign, term in re.findall(r"([-+]?)\s*(\d+(?:\s*\*\s*\d+)*)", expression))


def gtkwave_name(scope: str, name: str, bits: str, kind: str = "vcd") -> str:
    """How GTKWave 3.3 names signal ``name`` of ``scope`` and range ``bits`` in a Verilator
    dump of ``kind`` (as its ``gtkwave::getFacName`` lists them): the range is appended, but
    not an integer's in an FST dump; in a VCD dump, a name holding a ``.`` (a field of a
    layout: ``instr.op``) is escaped with a backslash: ``hwonnx_harness.accel.\\instr.op[3:0]``
    (``hwonnx_harness.accel.instr.op[3:0]`` in an FST dump)."""
    if bits == INTEGER:
        bits = "[31:0]" if kind == "vcd" else ""
    escape = "\\" if "." in name and kind == "vcd" else ""
    return f"{scope}.{escape}{name}{bits}"


def _format(name: str, bits: str, ops: bool) -> str:
    base = name.split("[")[0]
    if name == "instr__payload.op" and ops:
        return "ops"
    if not bits:
        return "bin"
    return "signed" if base in _SIGNED else "dec" if base in _DECIMAL else "hex"


def save_groups(signals: "dict[tuple[str, str], str]") -> "list[tuple[str, list]]":
    """The save file's groups (:data:`ENGINES`) with the signals of ``signals``
    (:func:`declared_signals`) in them: ``[(group, [(scope, name, bits), ...]), ...]``,
    without the groups left empty."""
    groups = []
    for group, below, names in ENGINES:
        scope = f"{HARNESS_TOP}.{below}".rstrip(".")
        found = []
        for name in names:
            if name.endswith("[*]"):
                lanes = (f"{name[:-3]}[{i}]" for i in count())
                found += [(scope, lane, signals[scope, lane]) for lane in
                          takewhile(lambda lane: (scope, lane) in signals, lanes)]
            elif (scope, name) in signals:
                found.append((scope, name, signals[scope, name]))
        if found:
            groups.append((group, found))
    return groups


def save_file(trace: Path, groups, *, start: "int | None", markers=(), ops: "Path | None" = None,
              length: int = 0) -> str:
    """The text of a GTKWave save file for dump ``trace``: ``groups`` (:func:`save_groups`),
    the primary marker at time ``start`` (the first sample's start, in the dump's units) and
    named markers A to Z at ``markers`` (``[(label, time), ...]``, the first 26), the view
    from just before ``start`` over ``length`` units; ``ops`` names the opcodes of the
    dispatched instruction (a GTKWave translate filter file)."""
    period = CLOCK_PERIOD_NS * UNITS_PER_NS
    lines = ["[*] Written by 'hwonnx sim --trace': the accelerator's signals by engine.",
             "[*] Cycle c of a sample starts c clock periods after its start marker (the "
             "accelerator's cycles counter reads c)."]
    named = list(markers)[:26]
    if start is not None:
        lines.append("[*] Primary marker: the first sample's start (cycle 0).")
    lines += [f"[*] Marker {chr(65 + i)}: {label}" for i, (label, _) in enumerate(named)]
    lines += [f'[dumpfile] "{Path(trace).resolve()}"', f"[size] {_SIZE[0]} {_SIZE[1]}",
              f"[timestart] {max(0, (start or 0) - 2 * period)}"]
    if start is not None:
        times = [str(time) for _, time in named] + ["-1"] * (26 - len(named))
        lines.append(f"*{_zoom(length + 4 * period):.6f} {start} {' '.join(times)}")
    filters = 0
    for group, traces in groups:
        lines += [f"@{_GROUP_BEGIN}", f"-{group}"]
        for scope, name, bits in traces:
            kind = _format(name, bits, ops is not None)
            lines.append(f"@{_FLAGS[kind]}")
            if kind == "ops":
                filters += 1
                lines.append(f"^{filters} {Path(ops).resolve()}")
            lines.append(gtkwave_name(scope, name, bits, trace_kind(trace)))
        lines += [f"@{_GROUP_END}", f"-{group}"]
    return "\n".join(lines) + "\n"


def _zoom(span: int) -> float:
    """GTKWave's zoom that shows ``span`` time units across the waves of a window of
    :data:`_SIZE`: a zoom of ``z`` shows ``2 ** -z`` units per 200 pixels (measured with
    GTKWave 3.3.118: ``gtkwave::getWindowEndTime``), and the waves are about 890 of its 1,400
    pixels wide."""
    return -math.log2(max(span, 100) * 200 / 890)


def opcode_filter() -> str:
    """A GTKWave translate filter file: each opcode (hex, as the dispatcher's ``instr__payload.op``
    is shown) and its instruction's name."""
    return "".join(f"{code:x} {name}\n" for code, name in sorted(Op.NAMES.items()))


def write_save_file(trace: Path, build_dir: Path, starts: "list[int]", cycles: int = 0,
                    markers: "list[tuple[str, int]]" = ()) -> Path:
    """Write ``<trace>.gtkw`` (and the opcodes' filter ``<trace>.ops.txt``) for ``trace``,
    dumped by the traced build ``build_dir``: ``starts`` are the samples' start times in ns
    (:data:`hwonnx.sim.trace.STARTS_FILE`), ``cycles`` the first sample's, ``markers``
    ``[(label, cycle), ...]`` cycles of the first sample (the layers' first cycles). Returns
    the save file's path."""
    sources = [p.read_text() for p in sorted(Path(build_dir).glob("*.v"))]
    period = CLOCK_PERIOD_NS * UNITS_PER_NS
    start = starts[0] * UNITS_PER_NS if starts else None
    named = [(label, start + cycle * period) for label, cycle in markers] if starts else []
    length = cycles * period
    ops = trace.with_name(trace.stem + ".ops.txt")
    ops.write_text(opcode_filter())
    save = trace.with_suffix(".gtkw")
    save.write_text(save_file(trace, save_groups(declared_signals(*sources)), start=start,
                              markers=named, ops=ops, length=length))
    return save


