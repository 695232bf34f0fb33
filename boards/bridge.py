"""The host bridge: the board's UART speaks the framed protocol of ``docs/protocol.md`` and
drives the accelerator's activation-buffer host ports, ``start`` and ``done``."""

from amaranth.hdl import Module
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..errors import ResourceError
from ..hdl.extmem import ext_port
from ..hdl.top import host_port
from . import protocol
from .bridge_logic import BridgeLogic, crc16_step
from .uart import CheckedComponent, check_divisor

__all__ = ["HostBridge", "crc16_step"]


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
        check_divisor(divisor)
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
        """The bridge, built in parts by :class:`~.bridge_logic.BridgeLogic`: the datapath
        beside the state machine first, then the state machine's states in the order a frame
        meets them.

        The order of the calls is part of the design: where two parts assign the same
        register in the same cycle (``lane``, ``addr``, ``xhave``, ``stale``), the later one
        wins, as in one ``elaborate`` written top to bottom."""
        m = Module()
        logic = BridgeLogic(self, m)
        logic.decode_command()
        logic.activation_read()
        logic.buffer_writes()
        if logic.ext:
            logic.external_writes()
            logic.external_reads()
        logic.payload_fields()
        logic.shift_data()
        logic.reply_payload()
        with m.FSM():
            logic.idle_state()
            logic.header_states()
            logic.length_states()
            logic.payload_state()
            logic.check_state()
            if logic.ext:
                logic.sum_state()
            logic.run_states()
            logic.reply_states()
        return m
