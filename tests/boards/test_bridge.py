"""HostBridge under the Amaranth simulator, driven through its UART pins by the real
:class:`hwonnx.boards.protocol.Client`: the testbench turns the client's bytes into rx pin
levels, decodes the tx pin, and models the accelerator (activation memory, start/busy/done)."""

import struct
from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hwonnx.boards.host import send_external
from hwonnx.boards.protocol import (
    CRC16_POLY, CRC_BYTES, PROTOCOL_VERSION, REPLY_HEAD, Client, Command, DeviceInfo,
    DeviceStatus, ProtocolError, Status, crc16, decode_reply, encode_frame, external_sums,
)
from hwonnx.compiler import predict
from hwonnx.isa import Op, encode
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError
from hwonnx.hdl import Accelerator
from hwonnx.hdl.bram import buffer_read_latency
from hwonnx.boards.bridge import HostBridge, crc16_step

from tests.boards.test_uart import UartDecoder, uart_levels

BUILD_ID = 0xC0FFEE42


def bridge_config(rows: int) -> ArchConfig:
    return ArchConfig(rows=rows, cols=2, act_depth=40, wgt_depth=8, acc_depth=4, par_depth=2,
                      prog_depth=4)


class FakeAccelerator:
    """The accelerator's host side: an activation memory whose word is on ``act_rdata`` the
    buffer's read latency after its address (``hdl/bram.py``), and a run that raises ``done``
    ``run_cycles`` cycles after ``start``."""

    def __init__(self, config: ArchConfig, run_cycles: int, rng):
        self.rows, self.run_cycles = config.rows, run_cycles
        self.mem = [int.from_bytes(rng.bytes(config.rows), "little")
                    for _ in range(config.act_depth)]
        self.busy = self.done = self.cycles = self.remaining = 0
        self.rdata = 0
        self._pipe = [0] * (buffer_read_latency(config) - 1)  # the words read, not yet out
        self.writes, self.starts, self.done_cycles = [], [], []

    def word(self, addr: int) -> bytes:
        return self.mem[addr].to_bytes(self.rows, "little")

    def drive(self, ctx, dut):
        for port, value in ((dut.accel.busy, self.busy), (dut.accel.done, self.done),
                            (dut.accel.cycles, self.cycles), (dut.accel.act_rdata, self.rdata)):
            ctx.set(port, value)

    def sample(self, ctx, dut, cycle):
        raddr = ctx.get(dut.accel.act_raddr)     # reads past the end are harmless, undefined
        self._pipe.append(self.mem[raddr] if raddr < len(self.mem) else 0)
        self.rdata = self._pipe.pop(0)
        if ctx.get(dut.accel.act_we):
            addr = ctx.get(dut.accel.act_addr)
            self.mem[addr] = ctx.get(dut.accel.act_data)
            self.writes.append(addr)
        if ctx.get(dut.accel.start):
            self.starts.append(cycle)
            self.busy, self.done, self.cycles, self.remaining = 1, 0, 0, self.run_cycles
        elif self.remaining:
            self.cycles += 1
            self.remaining -= 1
            if not self.remaining:
                self.busy, self.done = 0, 1
                self.done_cycles.append(cycle + 1)


class SimTransport:
    """A :class:`Client` transport over the simulated pins; ``read`` runs the simulation until
    the bytes arrived or a cycle budget is spent (then it returns what it has)."""

    def __init__(self, config: ArchConfig, *, divisor: int = 4, run_cycles: int = 37,
                 timeout_bits: int = 64, seed: int = 0, accelerator=None):
        self.divisor, self.rng = divisor, np.random.default_rng(seed)
        self.dut = HostBridge(config, divisor, BUILD_ID, timeout_bits=timeout_bits)
        self.model = FakeAccelerator(config, run_cycles, self.rng)
        top = self.dut
        if accelerator is not None:         # the real accelerator instead of the model
            top, self.model = BoardTop(self.dut, accelerator), None
        self.decoder = UartDecoder(divisor)
        self.levels: "deque[int]" = deque()
        self.received = bytearray()
        self.reply_cycles: "list[int]" = []
        # The external memory's writes, taken when its ready (random) is high, and its reads:
        # each taken when ready (random), its word returned 2 to 6 cycles later; while none is
        # outstanding, rvalid also rises with another requester's words.
        self.ext_writes = [] if config.ext_memory else None
        self.memory_up = (1, 0)             # the memory's ext_ready, ext_failed
        self.ext_mem_drops: "set[int]" = set()      # addresses whose writes are lost
        self.ext_mem: "dict[int, int]" = {}
        self.ext_reads: "list[int]" = []
        self.pending: "deque[tuple[int, int]]" = deque()
        self.cycle = 0
        self.sim = Simulator(top)
        self.sim.add_clock(1e-6)
        self.sim.add_testbench(self._bench, background=True)

    async def _bench(self, ctx):
        dut, model = self.dut, self.model
        while True:
            if model is not None:
                model.drive(ctx, dut)
            ctx.set(dut.rx, self.levels.popleft() if self.levels else 1)
            byte = self.decoder.feed(ctx.get(dut.tx))
            if byte is not None:
                self.received.append(byte)
                self.reply_cycles.append(self.cycle)
            if model is not None:
                model.sample(ctx, dut, self.cycle)
            if self.ext_writes is not None:
                ctx.set(dut.ext_ready, self.memory_up[0])
                ctx.set(dut.ext_failed, self.memory_up[1])
                ready = int(self.rng.random() < 0.5)
                ctx.set(dut.ext.wr_ready, ready)
                if ready and ctx.get(dut.ext.wr_valid):
                    self.ext_writes.append((ctx.get(dut.ext.wr_addr), ctx.get(dut.ext.wr_data)))
                    if self.ext_writes[-1][0] not in self.ext_mem_drops:
                        self.ext_mem[self.ext_writes[-1][0]] = self.ext_writes[-1][1]
                self._read_port(ctx, dut)
            await ctx.tick()
            self.cycle += 1

    def _read_port(self, ctx, dut):
        ready = int(self.rng.random() < 0.5)
        ctx.set(dut.ext.cmd_ready, ready)
        if ready and ctx.get(dut.ext.cmd_valid):
            assert ctx.get(dut.ext.cmd_len) == 1
            addr = ctx.get(dut.ext.cmd_addr)
            self.ext_reads.append(addr)
            self.pending.append((self.cycle + int(self.rng.integers(2, 7)), addr))
        if self.pending:
            assert ctx.get(dut.ext_reading)     # from the command until its word
        if self.pending and self.pending[0][0] <= self.cycle:
            ctx.set(dut.ext.rvalid, 1)
            ctx.set(dut.ext.rdata, self.ext_mem.get(self.pending.popleft()[1], 0))
        else:           # nothing, or while nothing is asked a word for someone else
            ctx.set(dut.ext.rvalid, int(not self.pending and self.rng.random() < 0.2))
            ctx.set(dut.ext.rdata, int(self.rng.integers(0, 1 << 16)))

    def run(self, cycles: int):
        self.sim.run_until((self.cycle + cycles) * 1e-6)

    def write_levels(self, levels):
        self.levels.extend(levels)

    def write(self, data: bytes):
        for byte in data:            # back to back, or up to two idle bit times in between
            self.levels.extend(uart_levels(byte, self.divisor) +
                               [1] * int(self.rng.integers(0, 3 * self.divisor)))

    def read(self, n: int) -> bytes:
        budget = self.cycle + len(self.levels) + 25 * self.divisor * (n + 8) + 500
        while len(self.received) < n and self.cycle < budget:
            self.run(10 * self.divisor)
        data = bytes(self.received[:n])
        del self.received[:n]
        return data


class BoardTop(Elaboratable):
    def __init__(self, bridge, accelerator):
        self.bridge, self.accelerator = bridge, accelerator

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge, m.submodules.accelerator = self.bridge, self.accelerator
        wiring.connect(m, self.bridge.accel, self.accelerator.host)
        return m


def raw_command(transport: SimTransport, frame: bytes) -> "tuple[int, bytes]":
    """Send ``frame`` as it is; the reply's status and payload. A reply to a frame whose CRC
    was right echoes its command byte and sequence number."""
    transport.write(frame)
    return read_reply(transport, frame)


def read_reply(transport: SimTransport, frame: bytes) -> "tuple[int, bytes]":
    """The status and payload of the reply to ``frame``, which was sent."""
    head = transport.read(REPLY_HEAD)
    status, cmd, seq, payload = decode_reply(head + transport.read(
        (head[-2] | head[-1] << 8) + CRC_BYTES))
    if status != Status.BAD_CRC:
        assert (cmd, seq) == (frame[1], frame[2])
    return status, payload


def test_info_reports_geometry_and_build_id():
    config = bridge_config(3)
    client = Client(SimTransport(config))
    info = DeviceInfo(PROTOCOL_VERSION, 3, 2, 40, BUILD_ID)
    assert client.info() == info and client.verify(config, BUILD_ID) == info


def test_crc_step_is_the_hosts_crc():
    """The bridge's CRC register, a byte per cycle, ends where ``binascii.crc_hqx`` does
    (checked by hand: CRC-16/CCITT-FALSE of b"123456789" is 0x29B1)."""
    assert crc16(b"123456789") == 0x29B1
    rng = np.random.default_rng(9)
    cases = [b"123456789", b"", bytes([0xFF, 0x00]), rng.bytes(40)]

    class Crc(Elaboratable):
        def __init__(self):
            self.crc, self.byte = Signal(16), Signal(8)

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.crc.eq(crc16_step(self.crc, self.byte, CRC16_POLY))
            return m

    dut = Crc()
    got = []

    async def bench(ctx):
        for data in cases:
            ctx.set(dut.crc, 0xFFFF)    # the register holds the initial value
            for byte in data:
                ctx.set(dut.byte, byte)
                await ctx.tick()
            got.append(ctx.get(dut.crc))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == [crc16(data) for data in cases]


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_write_then_read_back(rows):
    config = bridge_config(rows)
    transport = SimTransport(config, seed=rows)
    client, model = Client(transport), transport.model
    before = list(model.mem)
    data = transport.rng.bytes(5 * rows)
    client.write_words(7, data)
    assert model.writes == [7, 8, 9, 10, 11]
    assert b"".join(model.word(a) for a in range(7, 12)) == data
    assert model.mem[:7] == before[:7] and model.mem[12:] == before[12:]
    assert client.read_words(6, 7) == b"".join(model.word(a) for a in range(6, 13))
    # The last word of the buffer is in range; zero words are fine too.
    client.write_words(39, data[:rows])
    assert client.read_words(39, 1) == data[:rows]
    assert client.read_words(40, 0) == b""


def test_run_replies_when_done_with_cycles():
    transport = SimTransport(bridge_config(3), run_cycles=37)
    client, model = Client(transport), transport.model
    assert client.status() == DeviceStatus(busy=False, done=False, cycles=0)
    for run in range(2):                # the second run must wait for its own done
        assert client.run() == 37
        assert len(model.starts) == run + 1
        assert transport.reply_cycles[-12] > model.done_cycles[run]    # the sync byte
    assert client.status() == DeviceStatus(busy=False, done=True, cycles=37)
    model.busy, model.cycles = 1, 0xDEADBEEF
    assert client.status() == DeviceStatus(busy=True, done=True, cycles=0xDEADBEEF)


def test_bad_crc_is_reported_after_the_write():
    transport = SimTransport(bridge_config(3), seed=5)
    model = transport.model
    frame = bytearray(encode_frame(Command.WRITE, struct.pack("<H", 2) + bytes(range(6))))
    frame[-1] ^= 0x40
    assert raw_command(transport, bytes(frame)) == (Status.BAD_CRC, b"")
    # Documented: WRITE data is written as it arrives, before the CRC is known.
    assert model.writes == [2, 3] and model.word(2) + model.word(3) == bytes(range(6))
    frame = bytearray(encode_frame(Command.RUN))
    frame[1] ^= 1                       # a corrupted command byte is a CRC error too
    assert raw_command(transport, bytes(frame)) == (Status.BAD_CRC, b"")
    assert model.starts == []
    # Corruptions an additive check byte misses: two bytes swapped, +1 on one and -1 on
    # another (in the payload, in the command and sequence number).
    frame = encode_frame(Command.READ, struct.pack("<HH", 1, 2), seq=7)
    for damaged in (frame[:5] + frame[6:7] + frame[5:6] + frame[7:],
                    frame[:5] + bytes([frame[5] + 1]) + frame[6:7] + bytes([frame[7] - 1])
                    + frame[8:],
                    frame[:1] + bytes([frame[1] + 1, frame[2] - 1]) + frame[3:]):
        assert sum(damaged[1:-2]) == sum(frame[1:-2]) and damaged != frame
        assert raw_command(transport, damaged) == (Status.BAD_CRC, b"")
    status, payload = raw_command(transport, frame)
    assert status == Status.OK and payload == model.word(1) + model.word(2)


def test_unknown_command_consumes_its_payload():
    transport = SimTransport(bridge_config(3))
    client = Client(transport)
    assert raw_command(transport, encode_frame(0x05, b"\xa5\x00\x00")) == (
        Status.UNKNOWN_COMMAND, b"")
    with pytest.raises(ProtocolError, match=r"^Device rejected command 0xFF: status 0x02 "
                                            r"\(the command is unknown\)$"):
        client.command(0xFF)
    assert client.info().build_id == BUILD_ID


def test_bad_length_writes_and_runs_nothing():
    transport = SimTransport(bridge_config(3))
    model = transport.model
    for cmd, payload in [(Command.WRITE, b"\x00\x00" + bytes(4)), (Command.WRITE, b"\x00"),
                         (Command.READ, b"\x00\x00\x01"), (Command.INFO, b"\x00"),
                         (Command.RUN, b"\x00\x00"),
                         (Command.READ, struct.pack("<HH", 0, 0xFFFF // 3 + 1))]:
        assert raw_command(transport, encode_frame(cmd, payload)) == (Status.BAD_LENGTH, b"")
    assert model.writes == [] and model.starts == []
    with pytest.raises(ProtocolError, match=r"^Device rejected STATUS: status 0x03 \(the "
                                            r"payload length is wrong for the command\)$"):
        Client(transport).command(Command.STATUS, b"\x01")


def test_address_out_of_range_writes_nothing():
    transport = SimTransport(bridge_config(3))
    client, model = Client(transport), transport.model
    message = r"^Device rejected {}: status 0x04 \(the words are outside the buffer\)$"
    with pytest.raises(ProtocolError, match=message.format("WRITE")):
        client.write_words(39, bytes(6))
    assert model.writes == []
    for addr, count in [(38, 3), (40, 1), (0xFFFF, 1)]:
        with pytest.raises(ProtocolError, match=message.format("READ")):
            client.read_words(addr, count)
    assert client.read_words(38, 2) == model.word(38) + model.word(39)


def test_resynchronizes_after_noise_truncation_and_framing_error():
    transport = SimTransport(bridge_config(3), timeout_bits=64)
    client = Client(transport)
    transport.write(b"\x00\x5a\xff")                      # noise between frames
    assert client.info().build_id == BUILD_ID
    transport.write(encode_frame(Command.WRITE, bytes(8))[:5])   # the host gave up
    assert transport.read(1) == b""                       # silence: the bridge times out
    assert client.info().build_id == BUILD_ID
    assert transport.model.writes == []
    frame = encode_frame(Command.INFO)
    transport.write(frame[:2])
    transport.write_levels(uart_levels(frame[2], 4, stop=0) + [1] * 8)
    transport.write(frame[3:])
    assert transport.read(1) == b""                       # abandoned at the framing error
    assert client.info().build_id == BUILD_ID
    # A pause shorter than the timeout (64 bit times from one byte's end to the next's) is
    # fine.
    transport.write(frame[:3])
    transport.write_levels([1] * 50 * 4)
    transport.write(frame[3:])
    status, payload = read_reply(transport, frame)
    assert status == Status.OK and DeviceInfo.decode(payload).build_id == BUILD_ID


def test_with_the_real_accelerator():
    config = bridge_config(3)
    assert encode(op=Op.END) == 0       # so the empty program memory holds END at address 0
    accelerator = Accelerator(config)
    client = Client(SimTransport(config, accelerator=accelerator))
    assert client.verify(config, BUILD_ID).rows == 3
    data = bytes(range(200, 212))
    client.write_words(36, data)
    assert client.read_words(36, 4) == data
    cycles = client.run()
    assert 0 < cycles < 10
    assert client.status() == DeviceStatus(busy=False, done=True, cycles=cycles)


def narrow_config(rows: int) -> ArchConfig:
    """A program memory of 64-bit words loaded at run time (``LOAD``), as on the iCEBreaker."""
    return ArchConfig(rows=rows, cols=2, act_depth=40, wgt_depth=8, acc_depth=4, par_depth=2,
                      prog_depth=4, prog_width=64)


def test_load_program_then_run_on_the_real_accelerator():
    config = narrow_config(3)
    instructions = [dict(op=Op.LOADW, bank=0, wgt_addr=0), dict(op=Op.LOADW, bank=1, wgt_addr=3),
                    dict(op=Op.LOADW, bank=0, wgt_addr=5), dict(op=Op.END)]
    words = []
    for instr in instructions:
        word = encode(**instr)
        words += [(word >> (64 * k)) & ((1 << 64) - 1) for k in range(config.fetch_words)]
    transport = SimTransport(config, accelerator=Accelerator(config))
    client = Client(transport)
    client.verify(config, BUILD_ID)
    client.load_program(words, 64)
    # The cycle count of this program is set by the fetch unit: three LOADW of 4 cycles each
    # cannot hide seven-cycle fetches.
    assert client.run() == predict(instructions, config).total
    assert predict(instructions, config).total > predict(instructions, bridge_config(3)).total
    # Loading a shorter program over the first words changes what runs.
    client.load_program(words[-config.fetch_words:], 64)
    assert client.run() == predict([dict(op=Op.END)], config).total


def test_load_is_checked_like_write():
    config = narrow_config(2)
    transport = SimTransport(config, accelerator=Accelerator(config))
    client = Client(transport)
    message = r"^Device rejected LOAD: status 0x{:02X} \(the {}\)$"
    with pytest.raises(ProtocolError, match=message.format(4, "words are outside the buffer")):
        client.command(Command.LOAD, struct.pack("<H", config.prog_words - 1) + bytes(16))
    with pytest.raises(ProtocolError, match=message.format(
            3, "payload length is wrong for the command")):
        client.command(Command.LOAD, b"\x00\x00" + bytes(12))
    assert raw_command(transport, encode_frame(Command.LOAD, b"\x00")) == (Status.BAD_LENGTH, b"")


def ext_config() -> ArchConfig:
    """An external memory of 100,000 words of 2 bytes: addresses beyond 16 bits."""
    return ArchConfig(rows=3, cols=2, act_depth=40, wgt_depth=8, acc_depth=4, par_depth=2,
                      prog_depth=4, ext_memory="ulx3s-sdram", ext_depth=100_000)


def test_writex_writes_external_words_at_32_bit_addresses():
    transport = SimTransport(ext_config(), seed=4)
    client = Client(transport)
    words = [int(w) for w in transport.rng.integers(0, 1 << 16, 7)]
    client.write_external(words[:3], 16)
    client.write_external(words[3:], 16, addr=99_996)
    assert transport.ext_writes == list(zip([0, 1, 2, 99_996, 99_997, 99_998, 99_999], words))
    assert transport.model.writes == []              # nothing went to the activations
    client.write_words(0, bytes(range(3)))           # and WRITE still does
    assert transport.model.writes == [0] and len(transport.ext_writes) == 7


@pytest.mark.parametrize("up, message", [
    ((1, 0), None),
    ((0, 1), r"^The board's external memory 'ulx3s-sdram' failed to come up: its read leveling "
             r"found no working delay for a byte lane \(check the memory and its clock\)$"),
    ((0, 0), r"^The board's external memory 'ulx3s-sdram' is not up after 0.05 s \(STATUS "
             r"reports it neither ready nor failed\)$")])
def test_status_says_whether_the_external_memory_is_up(up, message):
    """STATUS flags bits 2 and 3: the host loads the external memory only once it is up, and
    names a memory that failed (or never came up) instead of timing out in a WRITEX."""
    transport = SimTransport(ext_config())
    transport.memory_up = up
    client = Client(transport)
    status = client.status()
    assert (status.memory_ready, status.memory_failed) == (bool(up[0]), bool(up[1]))
    if message is None:
        send_external(client, ext_config(), [7, 8])
        assert transport.ext_writes == [(0, 7), (1, 8)]
    else:
        with pytest.raises(ProtocolError, match=message):
            send_external(client, ext_config(), [7, 8], wait=0.05)
        assert transport.ext_writes == []


def test_sumx_sums_external_words_on_the_board():
    """SUMX's Fletcher sums equal the host's (protocol.external_sums) over any stretch, the
    words read on the memory's read port one at a time."""
    transport = SimTransport(ext_config(), seed=6)
    client = Client(transport)
    words = [int(w) for w in transport.rng.integers(0, 1 << 16, 9)]
    client.write_external(words, 16, addr=99_991)
    assert client.sum_external(99_991, 9) == external_sums(words, 16)
    assert client.sum_external(99_993, 4) == external_sums(words[2:6], 16)
    assert client.sum_external(99_990, 2) == external_sums([0, words[0]], 16)
    assert client.sum_external(5, 0) == (0, 0)
    assert transport.ext_reads == list(range(99_991, 100_000)) + [99_993, 99_994, 99_995,
                                                                   99_996, 99_990, 99_991]
    message = r"^Device rejected SUMX: status 0x{:02X} \(the {}\)$"
    with pytest.raises(ProtocolError, match=message.format(4, "words are outside the buffer")):
        client.sum_external(99_999, 2)
    with pytest.raises(ProtocolError, match=message.format(
            3, "payload length is wrong for the command")):
        client.command(Command.SUMX, bytes(4))


def test_the_host_loads_the_external_image_once_and_checks_it():
    """send_external writes only stretches whose sums differ from the image's, and sums them
    again: a second call writes nothing; a memory that drops a word is named."""
    config = ext_config()
    transport = SimTransport(config, seed=7)
    client = Client(transport)
    image = [int(w) for w in transport.rng.integers(1, 1 << 16, 12)]
    logged = []
    assert send_external(client, config, image, log=logged.append)
    assert [a for a, _ in transport.ext_writes] == list(range(12))
    assert logged == ["Loading words 0 to 12 of 12 into the board's external memory "
                      "'ulx3s-sdram' ..."]
    assert not send_external(client, config, image)          # already there
    assert len(transport.ext_writes) == 12
    image[4] ^= 1                                              # a new build's image
    assert send_external(client, config, image)
    assert len(transport.ext_writes) == 24
    transport.ext_mem_drops = {7}                              # a memory that loses a word
    image[7] ^= 1
    with pytest.raises(ProtocolError, match=r"^The board's external memory 'ulx3s-sdram' "
                                            r"holds other words than were written to words "
                                            r"\[0, 12\): it does not keep what it is given$"):
        send_external(client, config, image)


def test_writex_is_checked_like_write():
    transport = SimTransport(ext_config())
    client = Client(transport)
    message = r"^Device rejected WRITEX: status 0x{:02X} \(the {}\)$"
    with pytest.raises(ProtocolError, match=message.format(4, "words are outside the buffer")):
        client.write_external([1, 2], 16, addr=99_999)
    with pytest.raises(ProtocolError, match=message.format(
            3, "payload length is wrong for the command")):
        client.command(Command.WRITEX, bytes(4) + bytes(3))
    assert raw_command(transport, encode_frame(Command.WRITEX, bytes(3))) == (
        Status.BAD_LENGTH, b"")
    assert transport.ext_writes == [] and transport.model.writes == []


def test_readx_reads_external_words_back():
    """READX returns the words WRITEX wrote, each read on the memory's read port when its
    first byte is due; words the port returns that the bridge did not ask for are ignored."""
    transport = SimTransport(ext_config(), seed=5)
    client = Client(transport)
    words = [int(w) for w in transport.rng.integers(0, 1 << 16, 7)]
    client.write_external(words[:4], 16, addr=99_996)
    client.write_external(words[4:], 16, addr=5)

    def raw(ws):
        return b"".join(w.to_bytes(2, "little") for w in ws)
    assert client.read_external(99_996, 4, 16) == raw(words[:4])
    assert client.read_external(4, 5, 16) == raw([0] + words[4:] + [0])
    assert transport.ext_reads == [99_996, 99_997, 99_998, 99_999, 4, 5, 6, 7, 8]
    assert client.read_words(0, 2) == transport.model.word(0) + transport.model.word(1)


def test_readx_is_checked_like_read():
    transport = SimTransport(ext_config())
    client = Client(transport)
    message = r"^Device rejected READX: status 0x{:02X} \(the {}\)$"
    with pytest.raises(ProtocolError, match=message.format(4, "words are outside the buffer")):
        client.read_external(99_999, 2, 16)
    for payload in (bytes(5), struct.pack("<IH", 0, 40_000)):     # 80,000 bytes to reply
        with pytest.raises(ProtocolError, match=message.format(
                3, "payload length is wrong for the command")):
            client.command(Command.READX, payload)
    assert transport.ext_reads == []


def test_writex_and_load_exist_only_where_the_build_has_them():
    for config, cmd in ((bridge_config(3), Command.WRITEX), (bridge_config(3), Command.READX),
                        (bridge_config(3), Command.SUMX), (ext_config(), Command.LOAD)):
        transport = SimTransport(config)
        assert raw_command(transport, encode_frame(cmd, bytes(4) + bytes(6))) == (
            Status.UNKNOWN_COMMAND, b"")
        assert transport.model.writes == []


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(divisor=3), ValueError,
     r"^UART divisor must be an integer of at least 4 clock cycles per bit, not 3$"),
    (dict(build_id=1 << 32), ValueError,
     r"^Build id must be a 32-bit unsigned integer, not 4294967296$"),
    (dict(timeout_bits=8), ValueError, r"^Timeout must be at least 16 bit times, not 8$"),
    (dict(config=ArchConfig(act_depth=65536)), ResourceError,
     r"^Activation buffer must have at most 65535 words to be reached over the host link, "
     r"not 65536$"),
    (dict(config=ArchConfig(prog_width=64, prog_depth=11000)), ResourceError,
     r"^Program memory must have at most 65535 words to be loaded over the host link, not "
     rf"{ArchConfig(prog_width=64, prog_depth=11000).prog_words}$"),
])
def test_bad_parameters(kwargs, error, message):
    with pytest.raises(error, match=message):
        HostBridge(**(dict(config=bridge_config(2), divisor=4, build_id=0) | kwargs))
