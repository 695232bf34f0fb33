"""What the tests of the boards' external memories share (tests/boards/test_board_dram.py,
test_board_ddr3.py): the init writes of LiteDRAM's generated BIOS header, and a model of a
LiteDRAM native port at random speed."""

import re

__all__ = ["bios_writes", "NativePort"]


def bios_writes(folder):
    """The control-bus writes of ``init_sequence()`` in LiteDRAM's generated C header, with
    the register addresses of its generated ``csr.h``."""
    generated = folder / "litex" / "software" / "include" / "generated"
    csr = {name.lower(): int(value, 16) // 4 for name, value in re.findall(
        r"#define CSR_(\w+)_ADDR \(CSR_BASE \+ (0x[0-9a-f]+)L\)", (generated / "csr.h")
        .read_text())}
    header = (generated / "sdram_phy.h").read_text()
    bits = {name: int(value, 16) for name, value in re.findall(
        r"#define (DFII_\w+) (0x[0-9a-f]+)", header)}
    body = header[header.index("static inline void init_sequence(void)"):]
    body = body[:body.index("\n}\n")]
    writes = []
    for call, argument in re.findall(r"(\w+)\(([^)]*)\);", body):
        if call == "cdelay":
            adr, data, _ = writes[-1]
            writes[-1] = (adr, data, int(argument))
            continue
        value = sum(bits[n] for n in argument.split("|")) if "DFII" in argument \
            else int(argument, 0)
        if call == "command_p0":
            writes += [(csr["sdram_dfii_pi0_command"], value, 0),
                       (csr["sdram_dfii_pi0_command_issue"], 1, 0)]
        else:
            writes.append((csr[call.removesuffix("_write")], value, 0))
    return writes, csr, bits


class NativePort:
    """A native port at random speed: commands taken when its ``ready`` is high (random), a
    write's data after its command, in command order (LiteDRAM raises ``wdata.ready`` only for
    a write command it took), read data returned in command order 2 to 6 cycles later, one per
    cycle, none in the first ``stall`` cycles of every 400 (a refresh, long enough for
    commands to pile up)."""

    def __init__(self, bridge, rng, stall: int = 0):
        self.b, self.rng, self.stall = bridge, rng, stall
        self.memory, self.pending, self.writes = {}, [], []
        self.write_addrs = []

    def step(self, ctx, cycle):
        b, rng = self.b, self.rng
        cmd_ready = int(rng.random() < 0.6)
        wdata_ready = int(rng.random() < 0.6 and bool(self.write_addrs))
        ctx.set(b.port.cmd_ready, cmd_ready)
        ctx.set(b.port.wdata_ready, wdata_ready)
        ctx.set(b.port.rdata_valid, 0)
        if self.pending and self.pending[0][0] <= cycle and cycle % 400 >= self.stall:
            _, addr = self.pending.pop(0)
            ctx.set(b.port.rdata_valid, 1)
            ctx.set(b.port.rdata_data, self.memory.get(addr, 0))
            assert ctx.get(b.port.rdata_ready)
        if ctx.get(b.port.cmd_valid) and cmd_ready:
            addr = ctx.get(b.port.cmd_addr)
            if ctx.get(b.port.cmd_we):
                self.write_addrs.append(addr)
            else:
                last = self.pending[-1][0] if self.pending else cycle
                self.pending.append((max(last + 1, cycle + int(rng.integers(2, 7))), addr))
        if ctx.get(b.port.wdata_valid) and wdata_ready:
            assert ctx.get(b.port.wdata_we) == 0xFF
            addr = self.write_addrs.pop(0)
            self.memory[addr] = ctx.get(b.port.wdata_data)
            self.writes.append(addr)
