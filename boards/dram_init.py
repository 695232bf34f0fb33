"""The sequencer that brings a LiteDRAM core up over its Wishbone control bus, since the core
has no CPU to run LiteDRAM's BIOS: the BIOS's ``init_sequence()`` and, for a DDR PHY, its read
leveling (``liblitedram/sdram.c: sdram_read_leveling``), then the hand-over to the controller.

Read leveling, per byte lane (*module*): for each bitslip and each input delay of the PHY, write
test patterns to the memory through the DFI injector and read them back; the bitslip with the
most working delays wins (the first on a tie), and the delay is set to the middle of its longest
run of working delays. A delay works when every pattern reads back right in the lane's bytes
and (ECP5) the PHY saw the read burst. If no bitslip has a working delay for some lane, the
sequencer sets ``ddrctrl_init_error`` (the user port stays closed) and raises ``error``.
The BIOS scores by error counts too and re-centres with retries; on a fixed window both choose
the same bitslip and delay.
"""

import random
from dataclasses import dataclass

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["DramInit", "ReadLeveling", "DFII"]

#: Bits of LiteDRAM's DFI injector registers (``litedram/dfii.py``; the BIOS's
#: ``DFII_CONTROL_*`` and ``DFII_COMMAND_*``).
DFII = {"DFII_CONTROL_SEL": 0x01, "DFII_CONTROL_CKE": 0x02, "DFII_CONTROL_ODT": 0x04,
        "DFII_CONTROL_RESET_N": 0x08, "DFII_COMMAND_CS": 0x01, "DFII_COMMAND_WE": 0x02,
        "DFII_COMMAND_CAS": 0x04, "DFII_COMMAND_RAS": 0x08, "DFII_COMMAND_WRDATA": 0x10,
        "DFII_COMMAND_RDDATA": 0x20}

# The sequencer's operations, one per ROM word.
_WRITE, _WRITE_SEL, _CHECK, _BURST, _RETURN = range(5)
_KIND_BITS, _ADR_BITS, _DATA_BITS = 3, 30, 32
_TEST_WAIT = 15          # the BIOS's cdelay(15) after each injected command
_PATTERN_SEEDS = (42, 84, 36)


@dataclass(frozen=True)
class ReadLeveling:
    """What the sequencer needs to level a PHY's reads: from a generated core's registers and
    PHY settings (:func:`hwonnx.boards.litedram.read_leveling`).

    ``reg``: control register name -> word address; ``words``: its 32-bit words (most
    significant first); ``modules``: byte lanes; ``databits``: the memory's data bits (a beat);
    ``phase_bits``: data bits of one DFI phase; ``burst_detect``: the PHY reports seen read
    bursts (ECP5)."""
    reg: "dict[str, int]"
    words: "dict[str, int]"
    modules: int
    databits: int
    nphases: int
    phase_bits: int
    rdphase: int
    wrphase: int
    bitslips: int
    delays: int
    burst_detect: bool

    def __post_init__(self):
        if self.databits % 8 or 32 % self.databits or self.phase_bits % 32:
            raise ValueError(f"ReadLeveling supports 8, 16 or 32 data bits, not {self}")

    def patterns(self) -> "list[list[int]]":
        """The test patterns: per pattern, each phase's data (``phase_bits`` wide)."""
        return [[random.Random(seed * 16 + p).getrandbits(self.phase_bits)
                 for p in range(self.nphases)] for seed in _PATTERN_SEEDS]

    def lane_mask(self, module: int) -> int:
        """The bits of a 32-bit data word that belong to byte lane ``module``: a beat is
        ``databits`` wide and lane ``m`` is byte ``m`` of every beat."""
        lanes = self.databits // 8
        return sum(0xFF << (8 * b) for b in range(4) if b % lanes == module)


class DramInit(wiring.Component):
    """Performs ``writes`` (``(word address, data, cycles to wait after it)``, from
    :func:`hwonnx.boards.litedram.init_writes`) on a Wishbone bus in order after reset, each a
    classic single cycle held until ``ack``; the next begins ``wait + 2`` cycles after that
    ``ack``. With ``leveling``, ``writes`` must stop before the hand-over: the sequencer then
    levels the reads (module docstring) and performs ``handover`` (or ``failed`` when a lane
    has no working delay). Then raises ``done``.

    Members
    -------
    cyc, stb, we, adr, dat_w, sel, ack, dat_r : the Wishbone master (32-bit data, word
        addresses).
    done : ``Out(1)`` the last write and its wait are over.
    error : ``Out(1)`` read leveling found no working delay for some byte lane.
    """

    def __init__(self, writes: "list[tuple[int, int, int]]",
                 leveling: "ReadLeveling | None" = None,
                 handover: "list[tuple[int, int, int]]" = (),
                 failed: "list[tuple[int, int, int]]" = ()):
        if not writes:
            raise ValueError("DramInit needs at least one write")
        if leveling is not None and not (handover and failed):
            raise ValueError("DramInit with leveling needs the hand-over writes")
        self._leveling = leveling
        self._program, self._entry = self._assemble(list(writes), leveling, list(handover),
                                                    list(failed))
        super().__init__({
            "cyc": Out(1), "stb": Out(1), "we": Out(1), "adr": Out(_ADR_BITS),
            "dat_w": Out(_DATA_BITS), "sel": Out(4), "ack": In(1), "dat_r": In(_DATA_BITS),
            "done": Out(1), "error": Out(1),
        })

    @staticmethod
    def _assemble(writes, leveling, handover, failed):
        """The ROM (``(kind, address, data, wait)``) and each routine's first entry."""
        program, entry = [], {}

        def routine(name, ops):
            entry[name] = len(program)
            program.extend(ops + [(_RETURN, 0, 0, 0)])

        routine("init", [(_WRITE, a, d, w) for a, d, w in writes])
        if leveling is None:
            return program, entry
        lv, reg = leveling, leveling.reg
        all_lanes = (1 << lv.modules) - 1

        def action(register):      # the BIOS's sdram_leveling_action: select, act, deselect
            return [(_WRITE_SEL, reg["ddrphy_dly_sel"], 0, 0), (_WRITE, reg[register], 1, 0),
                    (_WRITE, reg["ddrphy_dly_sel"], 0, 0),
                    (_WRITE, reg["ddrphy_dly_sel"], all_lanes, 0),
                    (_WRITE, reg["ddrphy_dly_sel"], 0, 0)]

        def command(phase, value, wait=_TEST_WAIT):
            pi = f"sdram_dfii_pi{phase}_"
            return [(_WRITE, reg[pi + "address"], 0, 0), (_WRITE, reg[pi + "baddress"], 0, 0),
                    (_WRITE, reg[pi + "command"], value, 0),
                    (_WRITE, reg[pi + "command_issue"], 1, wait)]

        def words(name, value):
            n = lv.words[name]
            return [(reg[name] + i, (value >> (32 * (n - 1 - i))) & 0xFFFFFFFF)
                    for i in range(n)]

        bits = lambda names: sum(DFII[f"DFII_COMMAND_{n}"] for n in names.split())  # noqa: E731
        test = []
        for pattern in lv.patterns():
            test += command(0, bits("RAS CS"))                                # activate
            for p, value in enumerate(pattern):
                test += [(_WRITE, a, d, 0) for a, d in words(f"sdram_dfii_pi{p}_wrdata", value)]
            test += command(lv.wrphase, bits("CAS WE CS WRDATA"))
            if lv.burst_detect:
                test.append((_WRITE, reg["ddrphy_burstdet_clr"], 1, 0))
            test += command(lv.rdphase, bits("CAS CS RDDATA"))
            test += command(0, bits("RAS WE CS"))                             # precharge
            for p, value in enumerate(pattern):
                test += [(_CHECK, a, d, 0) for a, d in words(f"sdram_dfii_pi{p}_rddata", value)]
            if lv.burst_detect:
                test.append((_BURST, reg["ddrphy_burstdet_seen"], 0, 0))
        routine("test", test)
        for name, register in (("rst_delay", "ddrphy_rdly_dq_rst"),
                               ("inc_delay", "ddrphy_rdly_dq_inc"),
                               ("rst_bitslip", "ddrphy_rdly_dq_bitslip_rst"),
                               ("inc_bitslip", "ddrphy_rdly_dq_bitslip")):
            routine(name, action(register))
        routine("handover", [(_WRITE, a, d, w) for a, d, w in handover])
        routine("failed", [(_WRITE, a, d, w) for a, d, w in failed])
        return program, entry

    def elaborate(self, platform):
        m = Module()
        program, entry, lv = self._program, self._entry, self._leveling
        longest = max(op[3] for op in program)
        kind_at, data_at = _KIND_BITS, _KIND_BITS + _ADR_BITS
        wait_at = data_at + _DATA_BITS
        rom = Memory(shape=wait_at + max(1, longest.bit_length()), depth=len(program),
                     init=[k | (a << kind_at) | (d << data_at) | (w << wait_at)
                           for k, a, d, w in program])
        m.submodules.rom = rom
        read = rom.read_port(domain="comb")
        pc = Signal(range(len(program)))
        kind, adr = read.data[:kind_at], read.data[kind_at:data_at]
        data, wait_field = read.data[data_at:wait_at], read.data[wait_at:]
        wait = Signal(range(longest + 1))
        module = Signal(range(lv.modules if lv else 1))
        fail = Signal()                                  # the running test read a wrong word
        failed = Signal()
        m.d.comb += [read.addr.eq(pc), self.adr.eq(adr), self.sel.eq(0b1111),
                     self.we.eq((kind == _WRITE) | (kind == _WRITE_SEL)),
                     self.dat_w.eq(Mux(kind == _WRITE_SEL, 1 << module, data)),
                     self.error.eq(failed)]
        # A routine returns to the state ``resume`` names.
        after = ["finish"] + ([] if lv is None else [
            "init_done", "tested", "delay_stepped", "bitslip_stepped", "delays_reset",
            "bitslips_reset", "set_bitslip", "set_delay"])
        resume = Signal(range(len(after)))

        def call(name, then):
            m.d.sync += [pc.eq(entry[name]), resume.eq(after.index(then))]
            m.next = "RUN"

        with m.FSM():
            with m.State("START"):
                call("init", "finish" if lv is None else "init_done")
            with m.State("RUN"):
                with m.If(kind == _RETURN):
                    m.next = "DISPATCH"
                with m.Else():
                    m.d.comb += [self.cyc.eq(1), self.stb.eq(1)]
                    with m.If(self.ack):
                        m.d.sync += wait.eq(wait_field)
                        if lv is not None:
                            masks = Array(lv.lane_mask(i) for i in range(lv.modules))
                            wrong = ((self.dat_r ^ data) & masks[module]).any()
                            unseen = ~self.dat_r.bit_select(module, 1)
                            with m.If(((kind == _CHECK) & wrong) | ((kind == _BURST) & unseen)):
                                m.d.sync += fail.eq(1)
                        m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(wait != 0):
                    m.d.sync += wait.eq(wait - 1)
                with m.Else():
                    m.d.sync += pc.eq(pc + 1)
                    m.next = "RUN"
            with m.State("DISPATCH"):
                with m.Switch(resume):
                    for i, name in enumerate(after):
                        with m.Case(i):
                            m.next = name.upper()
            if lv is not None:
                self._level(m, call, module, fail, failed)
            with m.State("FINISH"):
                m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
        return m

    def _level(self, m, call, module, fail, failed):
        """The read-leveling states of the FSM (module docstring)."""
        lv = self._leveling
        bitslip, delay = Signal(range(lv.bitslips)), Signal(range(lv.delays))
        mask, best_mask = Signal(lv.delays), Signal(lv.delays)
        score, best_score = Signal(range(lv.delays + 1)), Signal(range(lv.delays + 1))
        best_bitslip = Signal(range(lv.bitslips))
        run_start, best_start = Signal(range(lv.delays)), Signal(range(lv.delays))
        best_len = Signal(range(lv.delays + 1))
        previous = Signal()                              # the delay before works
        steps = Signal(range(max(lv.bitslips, lv.delays)))
        with m.State("INIT_DONE"):
            m.d.sync += module.eq(0)
            call("rst_bitslip", "bitslips_reset")
        with m.State("BITSLIPS_RESET"):                  # a lane: scan every bitslip
            m.d.sync += [bitslip.eq(0), best_score.eq(0), best_bitslip.eq(0), best_mask.eq(0)]
            call("rst_delay", "delays_reset")
        with m.State("DELAYS_RESET"):                    # a bitslip: test every delay
            m.d.sync += [delay.eq(0), mask.eq(0), score.eq(0), fail.eq(0)]
            call("test", "tested")
        with m.State("TESTED"):
            with m.If(~fail):
                m.d.sync += [mask.bit_select(delay, 1).eq(1), score.eq(score + 1)]
            call("inc_delay", "delay_stepped")
        with m.State("DELAY_STEPPED"):
            with m.If(delay == lv.delays - 1):
                with m.If(score > best_score):
                    m.d.sync += [best_score.eq(score), best_bitslip.eq(bitslip),
                                 best_mask.eq(mask)]
                call("inc_bitslip", "bitslip_stepped")
            with m.Else():
                m.d.sync += [delay.eq(delay + 1), fail.eq(0)]
                call("test", "tested")
        with m.State("BITSLIP_STEPPED"):
            with m.If(bitslip == lv.bitslips - 1):
                m.d.sync += [delay.eq(0), best_len.eq(0), previous.eq(0)]
                m.next = "CENTRE"
            with m.Else():
                m.d.sync += bitslip.eq(bitslip + 1)
                call("rst_delay", "delays_reset")
        with m.State("CENTRE"):                          # the longest run of working delays
            starts = Signal(range(lv.delays))
            works = best_mask.bit_select(delay, 1)
            m.d.comb += starts.eq(Mux(previous, run_start, delay))
            m.d.sync += previous.eq(works)
            with m.If(works):
                m.d.sync += run_start.eq(starts)
                with m.If(delay - starts + 1 > best_len):
                    m.d.sync += [best_len.eq(delay - starts + 1), best_start.eq(starts)]
            with m.If(delay == lv.delays - 1):
                m.next = "CENTRED"
            with m.Else():
                m.d.sync += delay.eq(delay + 1)
        with m.State("CENTRED"):
            with m.If(best_len == 0):
                m.d.sync += failed.eq(1)
                call("failed", "finish")
            with m.Else():
                m.d.sync += steps.eq(0)
                call("rst_bitslip", "set_bitslip")
        with m.State("SET_BITSLIP"):
            with m.If(steps != best_bitslip):
                m.d.sync += steps.eq(steps + 1)
                call("inc_bitslip", "set_bitslip")
            with m.Else():
                m.d.sync += steps.eq(0)
                call("rst_delay", "set_delay")
        with m.State("SET_DELAY"):
            with m.If(steps != best_start + ((best_len - 1) >> 1)):
                m.d.sync += steps.eq(steps + 1)
                call("inc_delay", "set_delay")
            with m.Elif(module == lv.modules - 1):
                call("handover", "finish")
            with m.Else():
                m.d.sync += module.eq(module + 1)
                call("rst_bitslip", "bitslips_reset")
