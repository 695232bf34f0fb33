"""The host bridge's logic, part by part (:class:`BridgeLogic`): what
:class:`~hwonnx.boards.bridge.HostBridge` elaborates, one method per part of
``docs/protocol.md``, and the CRC-16 step its frames are checked with."""

import functools
import operator

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal

from ..hdl.bram import buffer_read_latency
from .uart import UartRx, UartTx

__all__ = ["BridgeLogic", "crc16_step"]


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


class BridgeLogic:
    """One elaboration of a :class:`HostBridge`: its ``Module``, its UARTs, the registers of
    the frame being received or answered, and a method per part of ``docs/protocol.md`` that
    adds that part's logic to the module.

    The registers every part shares are made here and named as in the protocol: ``cmd``,
    ``seq``, ``length`` (the frame's header), ``index`` (payload byte received or sent),
    ``addr`` and ``count`` (the command's address and word count), ``lane`` (byte within the
    word), ``wbuf`` (the word being received), ``err`` (the first error found: the reply's
    status unless the CRC is bad), ``status``, ``reply_len``, ``kind`` (what the reply's
    payload is) and the two CRCs, ``rcrc`` received and ``tcrc`` sent.
    """

    # What the reply's payload bytes are (the register ``kind``).
    K_NONE, K_INFO, K_READ, K_RUN, K_STATUS, K_READX, K_SUMX = range(7)

    def __init__(self, bridge, m: Module):       # bridge: the HostBridge elaborated
        self.bridge, self.m = bridge, m
        self.p, self.cfg, self.rows = bridge._protocol, bridge.config, bridge.config.rows
        self.load, self.ext = self.cfg.runtime_program, bool(self.cfg.ext_memory)
        self.pbytes = self.cfg.prog_width // 8          # bytes per program word (LOAD)
        self.xbytes = self.cfg.cols if self.ext else 0  # bytes per external word (WRITEX, READX)
        self.widest = max(self.rows, self.pbytes, self.xbytes)
        self.timeout = bridge._timeout
        self._uarts()
        self._frame_registers()
        self._reply_registers()

    def _uarts(self):
        """The physical layer (``docs/protocol.md``, "Physical layer"): a UART each way on the
        bridge's pins; ``byte`` is the received byte and ``got`` is high when it is taken.

        A byte is taken in every state but while the payload's length is checked
        (:meth:`length_states`), which ``pause``, a register, says: the receiver's ``ready``
        decoded from the state machine's state fed every register that takes a byte (the
        critical path of a ULX3S-85F build, 86.01 MHz: ``fsm_state`` -> ``got`` -> ``addr``,
        11.63 ns, 8.65 of it routing)."""
        m, bridge = self.m, self.bridge
        m.submodules.uart_rx = self.urx = UartRx(bridge._divisor)
        m.submodules.uart_tx = self.utx = UartTx(bridge._divisor)
        m.d.comb += [self.urx.rx.eq(bridge.rx), bridge.tx.eq(self.utx.tx)]
        self.byte = self.urx.data.payload
        self.pause = Signal()
        self.got = Signal()
        m.d.comb += [self.urx.data.ready.eq(~self.pause),
                     self.got.eq(self.urx.data.valid & ~self.pause)]

    def _frame_registers(self):
        """The registers of the frame being received ("Frames"), and what its command is
        ("Commands"): ``is_load``, ``is_ext`` (WRITEX), ``is_readx``, ``is_sumx``, ``wide``
        (a 32-bit address), ``unit`` (bytes per word), ``head`` (address bytes), ``writes``
        (WRITE, LOAD or WRITEX) and ``known``."""
        widest = self.widest
        self.cmd = Signal(8)
        self.seq = Signal(8)
        self.length = Signal(16)
        self.rcrc = Signal(16)                  # CRC of the frame's bytes after the sync byte
        self.err = Signal(8)                    # the first error found
        self.status = Signal(8)                 # the reply's
        self.index = Signal(16)                 # payload byte, received or sent
        self.addr = Signal(32 if self.ext else 16)
        self.count = Signal(16)
        self.words = Signal(16)
        self.lane = Signal(range(widest))
        self.wbuf = Signal(widest * 8)
        self.rem = Signal(range(2 * widest))
        self.it = Signal(range(16))
        self.is_load = Signal()
        self.is_ext = Signal()                  # WRITEX
        self.is_readx = Signal()
        self.is_sumx = Signal()
        self.wide = Signal()                    # a 32-bit address: WRITEX, READX, SUMX
        self.unit = Signal(range(widest + 1))   # bytes per word of the command's buffer
        self.head = Signal(3)                   # address bytes before the data
        self.writes = Signal()                  # WRITE, LOAD or WRITEX
        self.known = Signal()
        # A payload byte is handled in the cycle after it is taken, from registers: ``took``,
        # ``took_byte`` and ``took_index`` (:meth:`payload_fields`, :meth:`shift_data`).
        self.took = Signal()
        self.took_byte = Signal(8)
        self.took_index = Signal(16)
        self.data_byte = Signal()               # a data byte of WRITE, LOAD or WRITEX arrived
        # silent == (timer == timeout), kept in a register beside the timer so that the state
        # machine does not decide on the timer's compare (the state machine's own paths were
        # the critical one of a ULX3S-85F build, 85.49 MHz: 11.7 ns, 7.99 routing).
        self.timer = Signal(range(self.timeout + 1))
        self.silent = Signal()
        self.crc_in = crc16_step(self.rcrc, self.byte, self.p.CRC16_POLY)
        self.count_in = Cat(self.count[:8], self.took_byte)     # count, with its high byte
        self.reply_bytes = self.count_in * self.rows        # READ's reply length

    def _reply_registers(self):
        """The registers of the reply ("Frames", device to host): ``reply_len``, ``tcrc``,
        ``kind``, and what STATUS and RUN report (``flags``, ``cyc``)."""
        self.reply_len = Signal(16)
        self.tcrc = Signal(16)                  # CRC of the reply's bytes after the sync byte
        self.kind = Signal(range(7))            # reply payload source
        self.flags = Signal(8)
        self.cyc = Signal(32)

    def decode_command(self):
        """What the frame's ``cmd`` is ("Commands"): LOAD only with a program loaded at run
        time, WRITEX, READX and SUMX only with an external memory, and each command's word
        size and address bytes."""
        m, Cmd = self.m, self.p.Command
        cmd, load, ext = self.cmd, self.load, self.ext
        m.d.comb += [self.is_load.eq(cmd == Cmd.LOAD) if load else self.is_load.eq(0),
                     self.is_ext.eq(cmd == Cmd.WRITEX) if ext else self.is_ext.eq(0),
                     self.is_readx.eq(cmd == Cmd.READX) if ext else self.is_readx.eq(0),
                     self.is_sumx.eq(cmd == Cmd.SUMX) if ext else self.is_sumx.eq(0),
                     self.wide.eq(self.is_ext | self.is_readx | self.is_sumx),
                     self.unit.eq(Mux(self.is_ext, self.xbytes,
                                      Mux(self.is_load, self.pbytes, self.rows))),
                     self.head.eq(Mux(self.is_ext, 4, 2))]
        m.d.comb += self.writes.eq((cmd == Cmd.WRITE) | self.is_load | self.is_ext)
        m.d.comb += self.known.eq((cmd <= Cmd.STATUS) | self.is_load | self.is_ext
                                  | self.is_readx | self.is_sumx)

    def activation_read(self):
        """READ's read of the activation buffer ("Commands", READ; the reply is sent by
        :meth:`reply_states`).

        The address just advanced to is on the read port from a register in the next cycle,
        its word on the read data the buffer's read latency
        (:func:`~hwonnx.hdl.bram.buffer_read_latency`) after that and in ``act_word`` in the
        cycle after: no byte goes out meanwhile (``stale`` and its delays, ``stale_chain``).
        The block RAM's output drives only that register, not the lane select and the CRC
        (that path was the critical one of a ULX3S-85F build, 62.7 MHz), and the address
        register drives the activation buffer's blocks, not the frame's counters."""
        accel = self.bridge.accel
        self.stale = Signal()
        self.stale_chain = [self.stale]
        for stage in range(1 + buffer_read_latency(self.cfg)):
            delayed = Signal(name=f"stale_d{stage + 1}")
            self.m.d.sync += delayed.eq(self.stale_chain[-1])
            self.stale_chain.append(delayed)
        self.act_word = Signal.like(accel.act_rdata)
        self.m.d.sync += self.act_word.eq(accel.act_rdata)

    def buffer_writes(self):
        """WRITE and LOAD's writes ("Commands", "Status codes": data is written as it
        arrives): each word of the activation buffer or of the program memory goes out, from
        registers, in the cycle after its last byte arrives (no byte arrives meanwhile).

        The accelerator's buffers are spread over the device: driven straight from the
        frame's state machine, their write was the critical path of a ULX3S-85F build (93.55
        MHz: 10.69 ns, 8.07 of it routing). READ's read address is registered from ``addr``
        beside the write address."""
        m, accel, rows, pbytes = self.m, self.bridge.accel, self.rows, self.pbytes
        self.word_done = Signal()
        self.shifted = shifted = Cat(self.wbuf[8:], self.took_byte)     # this byte its last
        m.d.comb += self.word_done.eq(self.data_byte & (self.lane == self.unit - 1)
                                      & (self.err == 0))
        m.d.sync += [accel.act_raddr.eq(self.addr),
                     accel.act_addr.eq(self.addr), accel.act_data.eq(shifted[-rows * 8:]),
                     accel.act_we.eq(self.word_done & ~self.is_load & ~self.is_ext)]
        if self.load:
            m.d.sync += [accel.prog_addr.eq(self.addr),
                         accel.prog_we.eq(self.word_done & self.is_load),
                         accel.prog_data.eq(shifted[-pbytes * 8:])]

    def external_writes(self):
        """WRITEX's writes ("Commands", WRITEX): each word is handed to the external memory
        as its last byte arrives and held on ``ext.wr_*`` until the memory takes it."""
        m, ext, xbytes = self.m, self.bridge.ext, self.xbytes
        xvalid = Signal()
        xaddr = Signal(32)
        xdata = Signal(xbytes * 8)
        m.d.comb += [ext.wr_valid.eq(xvalid), ext.wr_addr.eq(xaddr), ext.wr_data.eq(xdata)]
        with m.If(ext.wr_ready):
            m.d.sync += xvalid.eq(0)
        with m.If(self.word_done & self.is_ext):
            m.d.sync += [xvalid.eq(1), xaddr.eq(self.addr),
                         xdata.eq(self.shifted[-xbytes * 8:])]

    def external_reads(self):
        """READX and SUMX's reads ("Commands", READX, SUMX): one read of one word at a time on
        ``ext.cmd_*`` at ``addr``, issued by the state that needs the word (``xhave`` once it
        is in ``xword``; ``ext_reading`` from the command until its word arrives), and SUMX's
        Fletcher sums of the words (``protocol.external_sums``), a word at a time."""
        m, bridge, ext = self.m, self.bridge, self.bridge.ext
        self.xword = Signal(self.xbytes * 8)
        self.xhave = Signal()
        self.xasked = xasked = Signal()
        m.d.comb += [ext.cmd_addr.eq(self.addr), ext.cmd_len.eq(1),
                     bridge.ext_reading.eq(ext.cmd_valid | xasked)]
        with m.If(ext.cmd_valid & ext.cmd_ready):
            m.d.sync += xasked.eq(1)
        with m.If(xasked & ext.rvalid):
            m.d.sync += [self.xword.eq(ext.rdata), self.xhave.eq(1), xasked.eq(0)]
        self.sum_a = Signal(32)
        self.sum_b = Signal(32)
        self.next_a, self.next_b = self.sum_a, self.sum_b       # the sums with xword added
        for chunk in range(-(-self.xbytes // 4)):
            self.next_a = (self.next_a + self.xword[32 * chunk:32 * chunk + 32])[:32]
            self.next_b = (self.next_b + self.next_a)[:32]

    def shift_data(self):
        """The data bytes of WRITE, LOAD and WRITEX shift into ``wbuf``; ``addr`` steps after
        each word's last byte. ``stale`` (:meth:`activation_read`) is high only in the cycle
        after READ's address steps."""
        m = self.m
        with m.If(self.data_byte):
            m.d.sync += [self.wbuf.eq(self.shifted), self.lane.eq(self.lane + 1)]
            with m.If(self.lane == self.unit - 1):
                m.d.sync += [self.lane.eq(0), self.addr.eq(self.addr + 1)]
        m.d.sync += self.stale.eq(0)

    def reply_payload(self):
        """The reply's payload byte at ``index`` ("Commands", the OK reply payloads), chosen
        by ``kind``: INFO's ``DeviceInfo`` from a ROM, the READ or READX word's byte at
        ``lane``, RUN's cycles, STATUS's flags and cycles, SUMX's sums. ``sent`` is high when
        the transmitter takes a byte."""
        m, p, cfg, index = self.m, self.p, self.cfg, self.index
        self.info = p.DeviceInfo(p.PROTOCOL_VERSION, self.rows, cfg.cols, cfg.act_depth,
                                 self.bridge._build_id)
        info_rom = Array(Const(b, 8) for b in self.info.encode())
        self.payload = payload = Signal(8)
        with m.Switch(self.kind):
            with m.Case(self.K_INFO):
                m.d.comb += payload.eq(info_rom[index[:4]])
            with m.Case(self.K_READ):
                m.d.comb += payload.eq(self.act_word.word_select(self.lane, 8))
            with m.Case(self.K_RUN):
                m.d.comb += payload.eq(self.cyc.word_select(index[:2], 8))
            with m.Case(self.K_STATUS):
                m.d.comb += payload.eq(Cat(self.flags, self.cyc).word_select(index[:3], 8))
            if self.ext:
                with m.Case(self.K_READX):
                    m.d.comb += payload.eq(self.xword.word_select(self.lane, 8))
                with m.Case(self.K_SUMX):
                    m.d.comb += payload.eq(Cat(self.sum_a, self.sum_b).word_select(index[:3], 8))
        self.sent = Signal()
        m.d.comb += self.sent.eq(self.utx.data.valid & self.utx.data.ready)

    # The state machine's helpers.

    def _fail(self, code):
        """Record an error status for the reply: the first error found wins ("Status
        codes")."""
        with self.m.If(self.err == 0):
            self.m.d.sync += self.err.eq(code)

    def _receiving(self):
        """In a state that receives a frame: abandon it, without a reply, after
        ``timeout_bits`` bit times of silence or on a framing error ("Framing rules")."""
        m = self.m
        with m.If(self.got):
            m.d.sync += [self.timer.eq(0), self.silent.eq(0)]
        with m.Elif(~self.silent):
            m.d.sync += [self.timer.eq(self.timer + 1),
                         self.silent.eq(self.timer + 1 == self.timeout)]
        with m.If(self.urx.error | self.silent):
            m.next = "IDLE"

    def _reply(self, kind, nbytes):
        """Send the reply: its payload is ``nbytes`` bytes of ``kind``."""
        self.m.d.sync += [self.kind.eq(kind), self.reply_len.eq(nbytes), self.index.eq(0)]
        self.m.next = "SYNC"

    # The state machine's states, in the order a frame meets them.

    def idle_state(self):
        """Between frames: discard every byte but the sync byte ("Framing rules",
        resynchronization), and get the frame's registers ready for the next one."""
        m, p = self.m, self.p
        with m.State("IDLE"):
            m.d.sync += [self.rcrc.eq(p.CRC16_INIT), self.err.eq(0), self.timer.eq(0),
                         self.silent.eq(0), self.index.eq(0), self.lane.eq(0),
                         self.pause.eq(0)]
            if self.ext:                        # WRITEX sets the upper address bytes
                m.d.sync += self.addr.eq(0)
            with m.If(self.got & (self.byte == p.FRAME_SYNC)):
                m.next = "CMD"

    def header_states(self):
        """The frame's header, ``cmd``, ``seq`` and ``len``, and the first byte of its CRC
        ("Frames"), each a state that takes one byte into the received CRC."""
        m = self.m
        for state, field, after in (("CMD", self.cmd, "SEQ"), ("SEQ", self.seq, "LEN_LO"),
                                    ("LEN_LO", self.length[:8], "LEN_HI"),
                                    ("LEN_HI", self.length[8:], "HEADER"),
                                    ("CRC_HI", None, "CHECK")):
            with m.State(state):
                with m.If(self.got):
                    m.d.sync += self.rcrc.eq(self.crc_in)
                    if field is not None:
                        m.d.sync += field.eq(self.byte)
                    if after == "HEADER":       # no byte is taken until the length is checked
                        m.d.sync += self.pause.eq(1)
                    m.next = after
                self._receiving()

    def length_states(self):
        """Check the command and its payload length before any payload byte arrives ("Status
        codes": UNKNOWN_COMMAND, BAD_LENGTH): ``words, rem = divmod(len - head, unit)``, one
        quotient bit per cycle, while the payload's first byte is on its way."""
        m, Cmd, St = self.m, self.p.Command, self.p.Status
        cmd, length, words, rem, unit = self.cmd, self.length, self.words, self.rem, self.unit
        is_xcount = self.is_readx | self.is_sumx
        with m.State("HEADER"):
            with m.If(~self.known):
                self._fail(St.UNKNOWN_COMMAND)
            with m.Elif(((cmd == Cmd.READ) & (length != 4)) |
                        (is_xcount & (length != 6)) |
                        (self.writes & (length < self.head)) |
                        ((cmd != Cmd.READ) & ~self.is_readx & ~self.is_sumx & ~self.writes
                         & (length != 0))):
                self._fail(St.BAD_LENGTH)
            m.d.sync += [words.eq(length - self.head), rem.eq(0), self.it.eq(0)]
            m.next = "DIVIDE"
            self._receiving()
        with m.State("DIVIDE"):
            partial = Cat(words[15], rem)
            with m.If(partial >= unit):
                m.d.sync += [rem.eq(partial - unit), words.eq(Cat(1, words[:15]))]
            with m.Else():
                m.d.sync += [rem.eq(partial), words.eq(Cat(0, words[:15]))]
            m.d.sync += self.it.eq(self.it + 1)
            with m.If(self.it == 15):
                m.next = "DIVIDED"
            self._receiving()
        with m.State("DIVIDED"):
            with m.If(self.writes & (rem != 0)):
                self._fail(St.BAD_LENGTH)
            m.d.sync += self.pause.eq(0)
            m.next = "PAYLOAD"
            with m.If(length == 0):
                m.next = "CRC_HI"
            self._receiving()

    def payload_fields(self):
        """The payload byte taken in the cycle before (``took``, ``took_byte`` at
        ``took_index``; the next one is a byte time away): the address and count bytes into
        ``addr`` and ``count`` (:meth:`_address_bytes`, :meth:`_external_count_bytes`), and
        data bytes to :meth:`shift_data`. The last one is handled while the CRC's first byte
        arrives, long before the frame is checked (:meth:`check_state`)."""
        m = self.m
        m.d.sync += self.took.eq(0)
        with m.If(self.took):
            with m.Switch(self.took_index):
                self._address_bytes()
                if self.ext:                    # READX, SUMX: the count after the address
                    self._external_count_bytes()
        m.d.comb += self.data_byte.eq(self.took & self.writes & (self.took_index >= self.head))

    def payload_state(self):
        """The frame's payload ("Commands", request payloads): each byte into the received CRC
        and into ``took_byte`` for :meth:`payload_fields`."""
        m, index = self.m, self.index
        with m.State("PAYLOAD"):
            with m.If(self.got):
                m.d.sync += [self.rcrc.eq(self.crc_in), index.eq(index + 1), self.took.eq(1),
                             self.took_byte.eq(self.byte), self.took_index.eq(index)]
                with m.If(index == self.length - 1):
                    m.next = "CRC_HI"
            self._receiving()

    def _address_bytes(self):
        """Payload bytes 0 to 3: the address (2 bytes, 4 for WRITEX, READX and SUMX), then
        READ's count; the address range of WRITE, LOAD, WRITEX and READ and READ's reply
        length are checked as soon as their last byte arrives ("Status codes": ADDRESS_RANGE,
        BAD_LENGTH), before any data byte."""
        m, p, cfg, St = self.m, self.p, self.cfg, self.p.Status
        addr, count, byte, words = self.addr, self.count, self.took_byte, self.words
        with m.Case(0):
            m.d.sync += addr[:8].eq(byte)
        with m.Case(1):
            m.d.sync += addr[8:].eq(byte)
            depth = Mux(self.is_load, cfg.prog_words, cfg.act_depth)
            with m.If(self.writes & ~self.is_ext & (Cat(addr[:8], byte) + words > depth)):
                self._fail(St.ADDRESS_RANGE)
        with m.Case(2):
            with m.If(self.wide):
                m.d.sync += addr[16:24].eq(byte)
            with m.Else():
                m.d.sync += count[:8].eq(byte)
        with m.Case(3):
            with m.If(self.wide):
                m.d.sync += addr[24:].eq(byte)
                with m.If(self.is_ext & (Cat(addr[:24], byte) + words > cfg.ext_depth)):
                    self._fail(St.ADDRESS_RANGE)
            with m.Else():
                m.d.sync += [count[8:].eq(byte), self.reply_len.eq(self.reply_bytes)]
            with m.If(self.cmd == p.Command.READ):
                with m.If(self.reply_bytes > p.MAX_PAYLOAD):
                    self._fail(St.BAD_LENGTH)
                with m.Elif(addr + self.count_in > cfg.act_depth):
                    self._fail(St.ADDRESS_RANGE)

    def _external_count_bytes(self):
        """Payload bytes 4 and 5 of READX and SUMX: the count, then their address range and
        READX's reply length ("Status codes": ADDRESS_RANGE, BAD_LENGTH)."""
        m, p, cfg, St = self.m, self.p, self.cfg, self.p.Status
        count, byte, count_in = self.count, self.took_byte, self.count_in
        with m.Case(4):
            with m.If(self.is_readx | self.is_sumx):
                m.d.sync += count[:8].eq(byte)
        with m.Case(5):
            with m.If(self.is_sumx):
                m.d.sync += count[8:].eq(byte)
                with m.If(self.addr + count_in > cfg.ext_depth):
                    self._fail(St.ADDRESS_RANGE)
            with m.If(self.is_readx):
                m.d.sync += [count[8:].eq(byte), self.reply_len.eq(count_in * self.xbytes)]
                with m.If(count_in * self.xbytes > p.MAX_PAYLOAD):
                    self._fail(St.BAD_LENGTH)
                with m.Elif(self.addr + count_in > cfg.ext_depth):
                    self._fail(St.ADDRESS_RANGE)

    def check_state(self):
        """The CRC's last byte ("Frames", CRC): the CRC of the frame's bytes after the sync
        byte, its own included, is 0. A frame with a bad CRC or an error is answered with its
        status and no payload ("Status codes"); an OK one is executed
        (:meth:`_execute`)."""
        m, St = self.m, self.p.Status
        with m.State("CHECK"):
            with m.If(self.got):
                with m.If(self.crc_in != 0):    # the CRC of the body and its CRC is 0
                    m.d.sync += self.status.eq(St.BAD_CRC)
                    self._reply(self.K_NONE, 0)
                with m.Elif(self.err != 0):
                    m.d.sync += self.status.eq(self.err)
                    self._reply(self.K_NONE, 0)
                with m.Else():
                    m.d.sync += self.status.eq(St.OK)
                    self._execute()
            self._receiving()

    def _execute(self):
        """An OK frame's command ("Commands"): INFO, WRITE, LOAD and WRITEX reply at once
        (their words are written already), READ and READX reply with words read as they are
        sent, SUMX sums first (:meth:`sum_state`), RUN starts the accelerator
        (:meth:`run_states`) and STATUS takes its flags and cycles now."""
        m, Cmd, bridge, ext = self.m, self.p.Command, self.bridge, self.ext
        with m.Switch(self.cmd):
            with m.Case(Cmd.INFO):
                self._reply(self.K_INFO, len(self.info.encode()))
            with m.Case(Cmd.WRITE, Cmd.LOAD, Cmd.WRITEX):
                self._reply(self.K_NONE, 0)
            with m.Case(Cmd.READ):
                self._reply(self.K_READ, self.reply_len)
                m.d.sync += self.lane.eq(0)
            if ext:
                with m.Case(Cmd.READX):
                    self._reply(self.K_READX, self.reply_len)
                    m.d.sync += [self.lane.eq(0), self.xhave.eq(0)]
            if ext:
                with m.Case(Cmd.SUMX):
                    m.d.sync += [self.sum_a.eq(0), self.sum_b.eq(0), self.xhave.eq(0)]
                    m.next = "SUM"
            with m.Case(Cmd.RUN):
                m.d.sync += bridge.accel.start.eq(1)
                m.next = "START"
            with m.Case(Cmd.STATUS):
                memory = (Cat(bridge.ext_ready, bridge.ext_failed) if ext
                          else Const(0, 2))
                m.d.sync += [self.flags.eq(Cat(bridge.accel.busy, bridge.accel.done, memory)),
                             self.cyc.eq(bridge.accel.cycles)]
                self._reply(self.K_STATUS, 5)

    def sum_state(self):
        """SUMX ("Commands", SUMX): read the ``count`` words from ``addr`` one at a time and
        add each to the sums, then reply with them."""
        m, ext = self.m, self.bridge.ext
        with m.State("SUM"):
            m.d.comb += [ext.cmd_valid.eq(~self.xhave & ~self.xasked & (self.count != 0))]
            with m.If(self.xhave):
                m.d.sync += [self.sum_a.eq(self.next_a), self.sum_b.eq(self.next_b),
                             self.xhave.eq(0), self.addr.eq(self.addr + 1),
                             self.count.eq(self.count - 1)]
            with m.Elif((self.count == 0) & ~self.xasked):
                self._reply(self.K_SUMX, 8)

    def run_states(self):
        """RUN ("Commands", RUN): ``start`` high for one cycle, then wait for ``done`` and
        reply with the accelerator's cycles."""
        m, accel = self.m, self.bridge.accel
        with m.State("START"):                  # start is a register, high in this state
            m.d.sync += accel.start.eq(0)
            m.next = "WAIT"
        with m.State("WAIT"):                   # done is low from the cycle after start
            with m.If(accel.done):
                m.d.sync += self.cyc.eq(accel.cycles)
                self._reply(self.K_RUN, 4)

    def reply_states(self):
        """The reply ("Frames", device to host): sync byte, status, ``cmd`` and ``seq``
        echoed, length, payload (:meth:`_payload_out_state`) and the CRC of every byte after
        the sync byte, high byte first. Bytes that arrive meanwhile are discarded ("Framing
        rules")."""
        p, tx = self.p, self.utx
        crc_out = crc16_step(self.tcrc, tx.data.payload, p.CRC16_POLY)
        self._send("SYNC", p.REPLY_SYNC, "STATUS", crc_out)
        self._send("STATUS", self.status, "CMD_OUT", crc_out)
        self._send("CMD_OUT", self.cmd, "SEQ_OUT", crc_out)
        self._send("SEQ_OUT", self.seq, "LEN_LO_OUT", crc_out)
        self._send("LEN_LO_OUT", self.reply_len[:8], "LEN_HI_OUT", crc_out)
        self._send("LEN_HI_OUT", self.reply_len[8:], "PAYLOAD_OUT", crc_out)
        self._payload_out_state(crc_out)
        self._send("CRC_HI_OUT", self.tcrc[8:], "CRC_LO_OUT", crc_out, crc=False)
        self._send("CRC_LO_OUT", self.tcrc[:8], "IDLE", crc_out, crc=False)

    def _send(self, state, value, after, crc_out, crc=True):
        """A state that sends one byte, ``value``, and goes to ``after``; the byte enters the
        reply's CRC (``crc_out``) unless ``crc`` is false, and the sync byte starts it."""
        m = self.m
        with m.State(state):
            m.d.comb += [self.utx.data.payload.eq(value), self.utx.data.valid.eq(1)]
            with m.If(self.sent):
                m.next = after
                if state == "SYNC":             # the CRC covers the bytes after it
                    m.d.sync += self.tcrc.eq(self.p.CRC16_INIT)
                elif crc:
                    m.d.sync += self.tcrc.eq(crc_out)

    def _payload_out_state(self, crc_out):
        """The reply's ``reply_len`` payload bytes (:meth:`reply_payload`). READ waits while
        the next word is read (:meth:`activation_read`); READX reads each word from the
        external memory before its first byte is sent."""
        m, lane, addr, index = self.m, self.lane, self.addr, self.index
        with m.State("PAYLOAD_OUT"):
            with m.If(index == self.reply_len):
                m.next = "CRC_HI_OUT"
            with m.Else():
                reading = (self.kind == self.K_READ) & Cat(*self.stale_chain).any()
                m.d.comb += [self.utx.data.payload.eq(self.payload),
                             self.utx.data.valid.eq(~reading)]
                if self.ext:                    # READX: a word must be read first
                    with m.If(self.kind == self.K_READX):
                        m.d.comb += [self.utx.data.valid.eq(self.xhave),
                                     self.bridge.ext.cmd_valid.eq(~self.xhave & ~self.xasked)]
                with m.If(self.sent):
                    m.d.sync += [index.eq(index + 1), self.tcrc.eq(crc_out)]
                    with m.If(self.kind == self.K_READ):
                        m.d.sync += lane.eq(lane + 1)
                        with m.If(lane == self.rows - 1):
                            m.d.sync += [lane.eq(0), addr.eq(addr + 1), self.stale.eq(1)]
                    if self.ext:
                        with m.If(self.kind == self.K_READX):
                            m.d.sync += lane.eq(lane + 1)
                            with m.If(lane == self.xbytes - 1):
                                m.d.sync += [lane.eq(0), addr.eq(addr + 1), self.xhave.eq(0)]
