"""The board side of the external memory (boards/litedram.py, boards/dram.py): LiteDRAM from
PyPI generates the ULX3S SDRAM controller; the init writes hwonnx runs are the ones LiteDRAM's
own BIOS header (``sdram_phy.h``, generated beside the core) performs; the sequencer performs
them on a Wishbone bus that acknowledges late; the bridge carries host writes and burst reads
over a native port whose handshakes stall at random, with the data in order."""

import re

import numpy as np
import pytest

from hwonnx.boards.dram import NativeBridge
from hwonnx.boards.dram_init import DramInit
from hwonnx.boards.litedram import generate_controller, init_writes

from hdl_helpers import run_cycles
from boards_helpers import NativePort, bios_writes


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return generate_controller("ulx3s-sdram", 25_000_000, 64, "LFE5U-85F-6BG381C",
                               tmp_path_factory.mktemp("litedram"))


def test_litedram_generates_the_ulx3s_controller(core):
    verilog = core.verilog.read_text()
    assert re.search(rf"^module {core.module} \(", verilog, re.M)
    for port in (r"inout\s+wire\s+\[15:0\] sdram_dq", r"output\s+wire\s+\[12:0\] sdram_a",
                 r"input\s+wire\s+\[21:0\] user_port_dma_cmd_addr",
                 r"output\s+wire\s+\[63:0\] user_port_dma_rdata_data",
                 r"input\s+wire\s+\[29:0\] wb_ctrl_adr"):
        assert re.search(port, verilog), port
    # 32 MB in words of 8 bytes: 22 address bits.
    assert (core.port_addr_bits, core.port_data_bits) == (22, 64)


def test_init_writes_are_litedram_bios_init_sequence(core):
    bios, csr, bits = bios_writes(core.verilog.parent)
    assert len(bios) == 3 + 6 * 4        # CKE high, then six commands
    assert init_writes(core) == bios + [(csr["sdram_dfii_control"], bits["DFII_CONTROL_SEL"], 0),
                                        (csr["ddrctrl_init_done"], 1, 0)]


def test_the_sequencer_performs_the_writes_and_waits():
    writes = [(0x200, 0xE, 5), (0x203, 0x400, 0), (0x201, 0xB, 0), (0x202, 1, 3), (0, 1, 0)]
    init = DramInit(writes)
    rng = np.random.default_rng(3)
    seen, state = [], {"ack_at": None, "last_ack": None, "done": None}

    def step(ctx, cycle):
        ctx.set(init.ack, 0)
        if ctx.get(init.cyc) and ctx.get(init.stb):
            assert ctx.get(init.we) and ctx.get(init.sel) == 0b1111
            if state["ack_at"] is None:
                state["ack_at"] = cycle + int(rng.integers(0, 4))
                if seen:              # the wait after the previous write, and two cycles
                    assert cycle - state["last_ack"] == seen[-1][2] + 2, cycle
            if cycle >= state["ack_at"]:
                ctx.set(init.ack, 1)
                seen.append((ctx.get(init.adr), ctx.get(init.dat_w),
                             writes[len(seen)][2] if len(seen) < len(writes) else None))
                state["ack_at"], state["last_ack"] = None, cycle
        if ctx.get(init.done) and state["done"] is None:
            state["done"] = cycle

    run_cycles(init, 80, step)
    assert seen == writes
    assert state["done"] is not None and state["done"] > state["last_ack"]


@pytest.mark.parametrize("width", [64, 48])
def test_the_bridge_writes_words_and_reads_bursts_in_order(width):
    """On a 64-bit port; 48-bit words (a 6-column array) are zero-extended on the way in and
    truncated on the way out."""
    rng = np.random.default_rng(11)
    bridge = NativeBridge(width, 22, burst=16, port_width=64)
    port = NativePort(bridge, rng)
    words = {int(a): int(rng.integers(0, 1 << 63)) >> (64 - width)
             for a in rng.choice(200, 40, replace=False)}
    to_write = list(words.items())
    reads = [(int(a), int(n))
             for a, n in zip(rng.integers(0, 180, 8), (1, 16, 3, 16, 7, 2, 16, 9))]
    expected = [words.get(a + i, 0) for a, n in reads for i in range(n)]
    got, state = [], {"write": 0, "read": 0}

    def step(ctx, cycle):
        port.step(ctx, cycle)
        writing = state["write"] < len(to_write)
        ctx.set(bridge.ext.wr_valid, int(writing))
        ctx.set(bridge.ext.cmd_valid, 0)
        if writing:
            ctx.set(bridge.ext.wr_addr, to_write[state["write"]][0])
            ctx.set(bridge.ext.wr_data, to_write[state["write"]][1])
            if ctx.get(bridge.ext.wr_ready):
                state["write"] += 1
        elif state["read"] < len(reads):            # then the reads, as the DMA asks
            addr, count = reads[state["read"]]
            ctx.set(bridge.ext.cmd_valid, 1)
            ctx.set(bridge.ext.cmd_addr, addr)
            ctx.set(bridge.ext.cmd_len, count)
            if ctx.get(bridge.ext.cmd_ready):
                state["read"] += 1
        if ctx.get(bridge.ext.rvalid):
            got.append(ctx.get(bridge.ext.rdata))

    run_cycles(bridge, 1500, step)
    assert port.writes == [a for a, _ in to_write]
    assert port.memory == words                 # upper bits of the port's word zero
    assert got == expected
