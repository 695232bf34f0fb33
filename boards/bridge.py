"""The host bridge: the board's UART speaks the framed protocol of ``docs/protocol.md`` and
drives the accelerator's activation-buffer host ports, ``start`` and ``done``."""

import functools
import operator

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..errors import ResourceError
from ..hdl.extmem import ext_port
from ..hdl.top import host_port
from . import protocol
from .uart import CheckedComponent, UartRx, UartTx, _check_divisor

__all__ = ["HostBridge", "crc16_step"]


def crc16_step(crc, byte, poly: int):
    """The CRC register after ``byte`` (most significant bit first) enters ``crc`` (16 bits):
    ``poly``'s CRC-16 a byte per cycle. Each bit of the result is the XOR of a few bits of
    ``crc`` and ``byte``, worked out here over GF(2) (eight shifts of the register, each
    input bit a set of the bits it depends on), so the expression stays flat."""
    bits = [{("crc", i)} for i in range(16)]
    for i in range(8):
        bits[8 + i] = bits[8 + i] ^ {("byte", i)}
    for _ in range(8):
        top = bits[15]
        bits = [set()] + bits[:15]
        bits = [b ^ top if poly >> k & 1 else b for k, b in enumerate(bits)]
    sources = {"crc": crc, "byte": byte}
    return Cat(*(functools.reduce(operator.xor, (sources[name][i] for name, i in sorted(b)))
                 for b in bits))


class HostBridge(CheckedComponent):
    """Parses host frames arriving on ``rx``, executes them on the accelerator's host ports and
    sends the reply on ``tx`` (protocol: ``docs/protocol.md``).

    Bytes are handled as they arrive; the only buffer is one word. A frame's length and, for
    ``WRITE``, its address range are checked before any data byte arrives, so a rejected
    ``WRITE`` writes nothing, but the CRC can only be checked at the end: a ``WRITE`` with a
    bad CRC has already written its words when it replies ``BAD_CRC``. Every reply echoes
    the frame's command byte and sequence number and ends with its own CRC.
    ``LOAD`` writes program words the same way; it exists only when the program memory is
    loaded at run time (``ArchConfig.prog_width``). ``WRITEX`` writes words into the
    external memory, each held on ``ext.wr_*`` until the memory takes it, and ``READX`` reads
    them back, one read of one word at a time on ``ext.cmd_*`` (``ext_reading`` high from the
    command until its word arrives); both exist only with an external memory
    (``ArchConfig.ext_memory``), which must take a written word within the time the next one
    takes to arrive. ``RUN`` pulses ``start`` and replies when
    ``done`` rises. One command is outstanding at a time: bytes that arrive while a command
    executes or its reply is being sent are discarded. A frame that stops arriving for
    ``timeout_bits`` bit times, or has a UART framing error, is abandoned without a reply.

    Parameters
    ----------
    config : ArchConfig
        Geometry and activation-buffer depth of the accelerator behind the bridge.
    divisor : int
        Clock cycles per UART bit (``clock_hz // baudrate``), at least 4.
    build_id : int
        32-bit number reported by ``INFO``, so the host can check it talks to the build it
        expects.
    timeout_bits : int
        Bit times of silence after which a partly received frame is abandoned.

    Members
    -------
    rx : ``In(1, init=1)``. tx : ``Out(1, init=1)``
        UART pins, 8N1.
    accel : ``Out(host_port(config))``
        To the accelerator's ``host`` port (``hdl/top.host_port``).
    ext : ``Out(ext_port(cols * 8, burst))``. ext_reading : ``Out(1)``
        Reads (one word each) and writes of the external memory (``hdl/extmem.py``), and
        whether a read of the bridge's is under way, with ``ext_memory`` only.
    ext_ready, ext_failed : ``In(1)``
        The external memory is up (its controller initialized, its reads leveled) or failed
        to come up: STATUS flags bits 2 and 3, with ``ext_memory`` only.

    Raises
    ------
    ValueError
        If ``divisor``, ``build_id`` or ``timeout_bits`` is out of range.
    ResourceError
        If the activation buffer or program memory has more words than a 16-bit address
        reaches.
    """

    @staticmethod
    def check(config: ArchConfig, divisor: int, build_id: int, *,
              timeout_bits: int = 1 << 16) -> None:
        _check_divisor(divisor)
        if config.act_depth > 0xFFFF:
            raise ResourceError(f"Activation buffer must have at most 65535 words to be reached "
                                f"over the host link, not {config.act_depth}")
        if config.runtime_program and config.prog_words > 0xFFFF:
            raise ResourceError(f"Program memory must have at most 65535 words to be loaded "
                                f"over the host link, not {config.prog_words}")
        if not isinstance(build_id, int) or not 0 <= build_id < 1 << 32:
            raise ValueError(f"Build id must be a 32-bit unsigned integer, not {build_id!r}")
        if not isinstance(timeout_bits, int) or timeout_bits < 16:
            raise ValueError(f"Timeout must be at least 16 bit times, not {timeout_bits!r}")

    def __init__(self, config: ArchConfig, divisor: int, build_id: int, *,
                 timeout_bits: int = 1 << 16):
        self._protocol = protocol      # the constants, with the host code they specify
        self._divisor = divisor
        self._config = config
        self._build_id = build_id
        self._timeout = timeout_bits * divisor
        members = {
            "rx": In(1, init=1), "tx": Out(1, init=1),
            "accel": Out(host_port(config)),
        }
        if config.ext_memory:
            members.update(ext=Out(ext_port(config.cols * 8, config.ext_timing.burst)),
                           ext_reading=Out(1), ext_ready=In(1), ext_failed=In(1))
        super().__init__(members)

    @property
    def config(self) -> ArchConfig:
        return self._config

    def elaborate(self, platform):
        p, cfg, rows = self._protocol, self.config, self.config.rows
        load, ext = cfg.runtime_program, bool(cfg.ext_memory)
        pbytes = cfg.prog_width // 8            # bytes per program word (LOAD)
        xbytes = cfg.cols if ext else 0         # bytes per external word (WRITEX, READX)
        widest = max(rows, pbytes, xbytes)
        Cmd, St = p.Command, p.Status
        m = Module()
        m.submodules.uart_rx = urx = UartRx(self._divisor)
        m.submodules.uart_tx = utx = UartTx(self._divisor)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx)]
        byte = urx.data.payload
        got = Signal()
        m.d.comb += got.eq(urx.data.valid & urx.data.ready)

        cmd, seq, length = Signal(8), Signal(8), Signal(16)
        rcrc = Signal(16)                       # CRC of the frame's bytes after the sync byte
        err, status = Signal(8), Signal(8)
        index = Signal(16)                      # payload byte, received or sent
        addr, count, words = Signal(32 if ext else 16), Signal(16), Signal(16)
        lane = Signal(range(widest))
        wbuf = Signal(widest * 8)
        rem, it = Signal(range(2 * widest)), Signal(range(16))
        is_load, is_ext, is_readx, is_sumx = Signal(), Signal(), Signal(), Signal()
        wide = Signal()                         # a 32-bit address: WRITEX, READX, SUMX
        unit = Signal(range(widest + 1))        # bytes per word of the command's buffer
        head = Signal(3)                        # address bytes before the data
        m.d.comb += [is_load.eq(cmd == Cmd.LOAD) if load else is_load.eq(0),
                     is_ext.eq(cmd == Cmd.WRITEX) if ext else is_ext.eq(0),
                     is_readx.eq(cmd == Cmd.READX) if ext else is_readx.eq(0),
                     is_sumx.eq(cmd == Cmd.SUMX) if ext else is_sumx.eq(0),
                     wide.eq(is_ext | is_readx | is_sumx),
                     unit.eq(Mux(is_ext, xbytes, Mux(is_load, pbytes, rows))),
                     head.eq(Mux(is_ext, 4, 2))]
        writes = Signal()                       # WRITE, LOAD or WRITEX
        m.d.comb += writes.eq((cmd == Cmd.WRITE) | is_load | is_ext)
        known = Signal()
        m.d.comb += known.eq((cmd <= Cmd.STATUS) | is_load | is_ext | is_readx | is_sumx)
        reply_len, tcrc = Signal(16), Signal(16)
        kind = Signal(range(7))                 # reply payload source
        K_NONE, K_INFO, K_READ, K_RUN, K_STATUS, K_READX, K_SUMX = range(7)
        flags, cyc = Signal(8), Signal(32)
        # READ: the address just advanced to is on the read port from a register in the next
        # cycle, its word on the read data in the one after and in act_word in the third: no
        # byte goes out meanwhile. The block RAM's output drives only that register, not the
        # lane select and the CRC (that path was the critical one of a ULX3S-85F build, 62.7
        # MHz), and the address register drives the activation buffer's blocks, not the
        # frame's counters.
        stale, stale_d, stale_d2 = Signal(), Signal(), Signal()
        act_word = Signal.like(self.accel.act_rdata)
        m.d.sync += [stale_d.eq(stale), stale_d2.eq(stale_d),
                     act_word.eq(self.accel.act_rdata)]
        # silent == (timer == timeout), kept in a register beside the timer so that the state
        # machine does not decide on the timer's compare (the state machine's own paths were
        # the critical one of a ULX3S-85F build, 85.49 MHz: 11.7 ns, 7.99 routing).
        timer, silent = Signal(range(self._timeout + 1)), Signal()

        # Activation word writes: each word goes out, from registers, in the cycle after its
        # last byte arrives (no byte arrives meanwhile). The accelerator's buffers are spread
        # over the device: driven straight from the frame's state machine, their write was
        # the critical path of a ULX3S-85F build (93.55 MHz: 10.69 ns, 8.07 of it routing).
        data_byte = Signal()
        word_done = Signal()
        shifted = Cat(wbuf[8:], byte)
        m.d.comb += word_done.eq(data_byte & (lane == unit - 1) & (err == 0))
        m.d.sync += [self.accel.act_raddr.eq(addr),
                     self.accel.act_addr.eq(addr), self.accel.act_data.eq(shifted[-rows * 8:]),
                     self.accel.act_we.eq(word_done & ~is_load & ~is_ext)]
        if load:
            m.d.sync += [self.accel.prog_addr.eq(addr), self.accel.prog_we.eq(word_done & is_load),
                         self.accel.prog_data.eq(shifted[-pbytes * 8:])]
        if ext:                                 # held until the memory takes it
            xvalid, xaddr, xdata = Signal(), Signal(32), Signal(xbytes * 8)
            m.d.comb += [self.ext.wr_valid.eq(xvalid), self.ext.wr_addr.eq(xaddr),
                         self.ext.wr_data.eq(xdata)]
            with m.If(self.ext.wr_ready):
                m.d.sync += xvalid.eq(0)
            with m.If(word_done & is_ext):
                m.d.sync += [xvalid.eq(1), xaddr.eq(addr), xdata.eq(shifted[-xbytes * 8:])]
            # READX: one word at a time, read when its first byte is to be sent
            xword, xhave, xasked = Signal(xbytes * 8), Signal(), Signal()
            m.d.comb += [self.ext.cmd_addr.eq(addr), self.ext.cmd_len.eq(1),
                         self.ext_reading.eq(self.ext.cmd_valid | xasked)]
            with m.If(self.ext.cmd_valid & self.ext.cmd_ready):
                m.d.sync += xasked.eq(1)
            with m.If(xasked & self.ext.rvalid):
                m.d.sync += [xword.eq(self.ext.rdata), xhave.eq(1), xasked.eq(0)]
            # SUMX: the words' Fletcher sums (protocol.external_sums), a word at a time
            sum_a, sum_b = Signal(32), Signal(32)
            next_a, next_b = sum_a, sum_b
            for chunk in range(-(-xbytes // 4)):
                next_a = (next_a + xword[32 * chunk:32 * chunk + 32])[:32]
                next_b = (next_b + next_a)[:32]
        with m.If(data_byte):
            m.d.sync += [wbuf.eq(shifted), lane.eq(lane + 1)]
            with m.If(lane == unit - 1):
                m.d.sync += [lane.eq(0), addr.eq(addr + 1)]
        m.d.sync += stale.eq(0)

        def fail(code):                         # first error wins
            with m.If(err == 0):
                m.d.sync += err.eq(code)

        def receiving():                        # abandon a frame on silence or framing error
            with m.If(got):
                m.d.sync += [timer.eq(0), silent.eq(0)]
            with m.Elif(~silent):
                m.d.sync += [timer.eq(timer + 1), silent.eq(timer + 1 == self._timeout)]
            with m.If(urx.error | silent):
                m.next = "IDLE"

        def reply(next_kind, nbytes):
            m.d.sync += [kind.eq(next_kind), reply_len.eq(nbytes), index.eq(0)]
            m.next = "SYNC"

        info = p.DeviceInfo(p.PROTOCOL_VERSION, rows, cfg.cols, cfg.act_depth, self._build_id)
        info_rom = Array(Const(b, 8) for b in info.encode())
        count_in = Cat(count[:8], byte)
        reply_bytes = count_in * rows
        payload = Signal(8)
        with m.Switch(kind):
            with m.Case(K_INFO):
                m.d.comb += payload.eq(info_rom[index[:4]])
            with m.Case(K_READ):
                m.d.comb += payload.eq(act_word.word_select(lane, 8))
            with m.Case(K_RUN):
                m.d.comb += payload.eq(cyc.word_select(index[:2], 8))
            with m.Case(K_STATUS):
                m.d.comb += payload.eq(Cat(flags, cyc).word_select(index[:3], 8))
            if ext:
                with m.Case(K_READX):
                    m.d.comb += payload.eq(xword.word_select(lane, 8))
                with m.Case(K_SUMX):
                    m.d.comb += payload.eq(Cat(sum_a, sum_b).word_select(index[:3], 8))

        sent = Signal()
        m.d.comb += sent.eq(utx.data.valid & utx.data.ready)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += urx.data.ready.eq(1)
                m.d.sync += [rcrc.eq(p.CRC16_INIT), err.eq(0), timer.eq(0), silent.eq(0),
                             index.eq(0),
                             lane.eq(0)]
                if ext:                         # WRITEX sets the upper address bytes
                    m.d.sync += addr.eq(0)
                with m.If(got & (byte == p.FRAME_SYNC)):
                    m.next = "CMD"
            crc_in = crc16_step(rcrc, byte, p.CRC16_POLY)
            for state, field, after in (("CMD", cmd, "SEQ"), ("SEQ", seq, "LEN_LO"),
                                        ("LEN_LO", length[:8], "LEN_HI"),
                                        ("LEN_HI", length[8:], "HEADER"),
                                        ("CRC_HI", None, "CHECK")):
                with m.State(state):
                    m.d.comb += urx.data.ready.eq(1)
                    with m.If(got):
                        m.d.sync += rcrc.eq(crc_in)
                        if field is not None:
                            m.d.sync += field.eq(byte)
                        m.next = after
                    receiving()
            with m.State("HEADER"):
                with m.If(~known):
                    fail(St.UNKNOWN_COMMAND)
                with m.Elif(((cmd == Cmd.READ) & (length != 4)) |
                          ((is_readx | is_sumx) & (length != 6)) |
                          (writes & (length < head)) |
                          ((cmd != Cmd.READ) & ~is_readx & ~is_sumx & ~writes & (length != 0))):
                    fail(St.BAD_LENGTH)
                # words, rem = divmod(length - head, unit), one quotient bit per cycle
                m.d.sync += [words.eq(length - head), rem.eq(0), it.eq(0)]
                m.next = "DIVIDE"
                receiving()
            with m.State("DIVIDE"):
                partial = Cat(words[15], rem)
                with m.If(partial >= unit):
                    m.d.sync += [rem.eq(partial - unit), words.eq(Cat(1, words[:15]))]
                with m.Else():
                    m.d.sync += [rem.eq(partial), words.eq(Cat(0, words[:15]))]
                m.d.sync += it.eq(it + 1)
                with m.If(it == 15):
                    m.next = "DIVIDED"
                receiving()
            with m.State("DIVIDED"):
                with m.If(writes & (rem != 0)):
                    fail(St.BAD_LENGTH)
                m.next = "PAYLOAD"
                with m.If(length == 0):
                    m.next = "CRC_HI"
                receiving()
            with m.State("PAYLOAD"):
                m.d.comb += urx.data.ready.eq(1)
                with m.If(got):
                    m.d.sync += [rcrc.eq(crc_in), index.eq(index + 1)]
                    with m.Switch(index):
                        with m.Case(0):
                            m.d.sync += addr[:8].eq(byte)
                        with m.Case(1):
                            m.d.sync += addr[8:].eq(byte)
                            depth = Mux(is_load, cfg.prog_words, cfg.act_depth)
                            with m.If(writes & ~is_ext & (Cat(addr[:8], byte) + words > depth)):
                                fail(St.ADDRESS_RANGE)
                        with m.Case(2):
                            with m.If(wide):
                                m.d.sync += addr[16:24].eq(byte)
                            with m.Else():
                                m.d.sync += count[:8].eq(byte)
                        with m.Case(3):
                            with m.If(wide):
                                m.d.sync += addr[24:].eq(byte)
                                with m.If(is_ext & (Cat(addr[:24], byte) + words
                                                    > cfg.ext_depth)):
                                    fail(St.ADDRESS_RANGE)
                            with m.Else():
                                m.d.sync += [count[8:].eq(byte), reply_len.eq(reply_bytes)]
                            with m.If(cmd == Cmd.READ):
                                with m.If(reply_bytes > p.MAX_PAYLOAD):
                                    fail(St.BAD_LENGTH)
                                with m.Elif(addr + count_in > cfg.act_depth):
                                    fail(St.ADDRESS_RANGE)
                        if ext:                 # READX, SUMX: the count after the address
                            with m.Case(4):
                                with m.If(is_readx | is_sumx):
                                    m.d.sync += count[:8].eq(byte)
                            with m.Case(5):
                                with m.If(is_sumx):
                                    m.d.sync += count[8:].eq(byte)
                                    with m.If(addr + count_in > cfg.ext_depth):
                                        fail(St.ADDRESS_RANGE)
                                with m.If(is_readx):
                                    m.d.sync += [count[8:].eq(byte),
                                                 reply_len.eq(count_in * xbytes)]
                                    with m.If(count_in * xbytes > p.MAX_PAYLOAD):
                                        fail(St.BAD_LENGTH)
                                    with m.Elif(addr + count_in > cfg.ext_depth):
                                        fail(St.ADDRESS_RANGE)
                    m.d.comb += data_byte.eq(writes & (index >= head))
                    with m.If(index == length - 1):
                        m.next = "CRC_HI"
                receiving()
            with m.State("CHECK"):
                m.d.comb += urx.data.ready.eq(1)
                with m.If(got):
                    with m.If(crc_in != 0):   # the CRC of the body and its CRC is 0
                        m.d.sync += status.eq(St.BAD_CRC)
                        reply(K_NONE, 0)
                    with m.Elif(err != 0):
                        m.d.sync += status.eq(err)
                        reply(K_NONE, 0)
                    with m.Else():
                        m.d.sync += status.eq(St.OK)
                        with m.Switch(cmd):
                            with m.Case(Cmd.INFO):
                                reply(K_INFO, len(info.encode()))
                            with m.Case(Cmd.WRITE, Cmd.LOAD, Cmd.WRITEX):
                                reply(K_NONE, 0)
                            with m.Case(Cmd.READ):
                                reply(K_READ, reply_len)
                                m.d.sync += lane.eq(0)
                            if ext:
                                with m.Case(Cmd.READX):
                                    reply(K_READX, reply_len)
                                    m.d.sync += [lane.eq(0), xhave.eq(0)]
                            if ext:
                                with m.Case(Cmd.SUMX):
                                    m.d.sync += [sum_a.eq(0), sum_b.eq(0), xhave.eq(0)]
                                    m.next = "SUM"
                            with m.Case(Cmd.RUN):
                                m.d.sync += self.accel.start.eq(1)
                                m.next = "START"
                            with m.Case(Cmd.STATUS):
                                memory = (Cat(self.ext_ready, self.ext_failed) if ext
                                          else Const(0, 2))
                                m.d.sync += [flags.eq(Cat(self.accel.busy, self.accel.done,
                                                          memory)),
                                             cyc.eq(self.accel.cycles)]
                                reply(K_STATUS, 5)
                receiving()
            if ext:
                with m.State("SUM"):            # SUMX: read and sum count words, then reply
                    m.d.comb += [urx.data.ready.eq(1),
                                 self.ext.cmd_valid.eq(~xhave & ~xasked & (count != 0))]
                    with m.If(xhave):
                        m.d.sync += [sum_a.eq(next_a), sum_b.eq(next_b), xhave.eq(0),
                                     addr.eq(addr + 1), count.eq(count - 1)]
                    with m.Elif((count == 0) & ~xasked):
                        reply(K_SUMX, 8)
            with m.State("START"):              # start is a register, high in this state
                m.d.comb += urx.data.ready.eq(1)
                m.d.sync += self.accel.start.eq(0)
                m.next = "WAIT"
            with m.State("WAIT"):               # done is low from the cycle after start
                m.d.comb += urx.data.ready.eq(1)
                with m.If(self.accel.done):
                    m.d.sync += cyc.eq(self.accel.cycles)
                    reply(K_RUN, 4)

            crc_out = crc16_step(tcrc, utx.data.payload, p.CRC16_POLY)

            def send(state, value, after, crc=True):
                with m.State(state):
                    m.d.comb += [urx.data.ready.eq(1), utx.data.payload.eq(value),
                                 utx.data.valid.eq(1)]
                    with m.If(sent):
                        m.next = after
                        if state == "SYNC":     # the CRC covers the bytes after it
                            m.d.sync += tcrc.eq(p.CRC16_INIT)
                        elif crc:
                            m.d.sync += tcrc.eq(crc_out)
            send("SYNC", p.REPLY_SYNC, "STATUS")
            send("STATUS", status, "CMD_OUT")
            send("CMD_OUT", cmd, "SEQ_OUT")
            send("SEQ_OUT", seq, "LEN_LO_OUT")
            send("LEN_LO_OUT", reply_len[:8], "LEN_HI_OUT")
            send("LEN_HI_OUT", reply_len[8:], "PAYLOAD_OUT")
            with m.State("PAYLOAD_OUT"):
                m.d.comb += urx.data.ready.eq(1)
                with m.If(index == reply_len):
                    m.next = "CRC_HI_OUT"
                with m.Else():
                    reading = (kind == K_READ) & (stale | stale_d | stale_d2)
                    m.d.comb += [utx.data.payload.eq(payload), utx.data.valid.eq(~reading)]
                    if ext:                     # READX: a word must be read first
                        with m.If(kind == K_READX):
                            m.d.comb += [utx.data.valid.eq(xhave),
                                         self.ext.cmd_valid.eq(~xhave & ~xasked)]
                    with m.If(sent):
                        m.d.sync += [index.eq(index + 1), tcrc.eq(crc_out)]
                        with m.If(kind == K_READ):
                            m.d.sync += lane.eq(lane + 1)
                            with m.If(lane == rows - 1):
                                m.d.sync += [lane.eq(0), addr.eq(addr + 1), stale.eq(1)]
                        if ext:
                            with m.If(kind == K_READX):
                                m.d.sync += lane.eq(lane + 1)
                                with m.If(lane == xbytes - 1):
                                    m.d.sync += [lane.eq(0), addr.eq(addr + 1), xhave.eq(0)]
            send("CRC_HI_OUT", tcrc[8:], "CRC_LO_OUT", crc=False)
            send("CRC_LO_OUT", tcrc[:8], "IDLE", crc=False)
        return m
