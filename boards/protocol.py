"""The host-link protocol spoken over a board's UART (see ``docs/protocol.md``): frame and
reply encoding, and a :class:`Client` that runs over any byte transport.

Nothing here imports pyserial or cocotb: the same client drives a real board
(:class:`hwonnx.boards.host.SerialTransport`) and the simulated UART pins of a cocotb test.
"""

import binascii
import enum
import struct
from dataclasses import dataclass

from ..config import ArchConfig
from ..errors import HwonnxError

__all__ = [
    "ProtocolError", "Command", "Status", "FRAME_SYNC", "REPLY_SYNC", "PROTOCOL_VERSION",
    "MAGIC", "MAX_PAYLOAD", "crc16", "CRC16_POLY", "CRC16_INIT", "FRAME_HEAD", "REPLY_HEAD",
    "CRC_BYTES",
    "encode_frame", "decode_frame", "encode_reply",
    "decode_reply", "DeviceInfo", "DeviceStatus", "Client", "BITS_PER_BYTE", "transfer_bytes",
]

FRAME_SYNC = 0xA5
REPLY_SYNC = 0x5A
PROTOCOL_VERSION = 2
MAGIC = b"HWNX"
MAX_PAYLOAD = 0xFFFF


class ProtocolError(HwonnxError):
    """The device sent something the protocol does not allow, reported an error status, did
    not answer in time, or is not the build the host expects."""


class Command(enum.IntEnum):
    INFO = 0x00
    WRITE = 0x01
    READ = 0x02
    RUN = 0x03
    STATUS = 0x04
    LOAD = 0x05
    WRITEX = 0x06
    READX = 0x07
    SUMX = 0x08


class Status(enum.IntEnum):
    OK = 0x00
    BAD_CRC = 0x01
    UNKNOWN_COMMAND = 0x02
    BAD_LENGTH = 0x03
    ADDRESS_RANGE = 0x04


_STATUS_TEXT = {
    Status.BAD_CRC: "the frame's CRC was wrong: it was corrupted on the way",
    Status.UNKNOWN_COMMAND: "the command is unknown",
    Status.BAD_LENGTH: "the payload length is wrong for the command",
    Status.ADDRESS_RANGE: "the words are outside the buffer",
}


def external_sums(words: "list[int]", width: int) -> "tuple[int, int]":
    """The Fletcher sums SUMX returns for ``words`` of ``width`` bits: each word zero-extended
    to whole 32-bit chunks, least significant first, and for each chunk ``c``:
    ``a = (a + c) mod 2**32``, then ``b = (b + a) mod 2**32``, from ``a = b = 0``."""
    a = b = 0
    chunks = -(-width // 32)
    for word in words:
        for k in range(chunks):
            a = (a + (int(word) >> (32 * k) & 0xFFFFFFFF)) & 0xFFFFFFFF
            b = (b + a) & 0xFFFFFFFF
    return a, b


#: CRC-16/CCITT-FALSE: the polynomial and initial value (bits most significant first, no
#: final XOR) of the CRC that ends every frame and reply; ``binascii.crc_hqx`` computes it.
CRC16_POLY, CRC16_INIT = 0x1021, 0xFFFF


def crc16(data: bytes) -> int:
    """The CRC-16/CCITT-FALSE of ``data``: the check of every frame and reply."""
    return binascii.crc_hqx(bytes(data), CRC16_INIT)


#: Bytes before a frame's payload (sync, command, sequence, length) and before a reply's
#: (sync, status, command, sequence, length); both end with the two CRC bytes.
FRAME_HEAD, REPLY_HEAD, CRC_BYTES = 5, 6, 2


def _encode(sync: int, head: bytes, payload: bytes) -> bytes:
    payload = bytes(payload)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"Payload must be at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    body = bytes(head) + struct.pack("<H", len(payload)) + payload
    return bytes([sync]) + body + struct.pack(">H", crc16(body))


def _decode(data: bytes, sync: int, head: int, what: str) -> "tuple[bytes, bytes]":
    data = bytes(data)
    if len(data) < head + CRC_BYTES:
        raise ProtocolError(f"{what} must be at least {head + CRC_BYTES} bytes long, not "
                            f"{len(data)}")
    if data[0] != sync:
        raise ProtocolError(f"{what} must start with 0x{sync:02X}, not 0x{data[0]:02X}")
    length = data[head - 2] | data[head - 1] << 8
    if len(data) != head + length + CRC_BYTES:
        raise ProtocolError(f"{what} with a {length}-byte payload must be "
                            f"{head + length + CRC_BYTES} bytes long, not {len(data)}")
    if crc16(data[1:]):          # the CRC of the body followed by its CRC is 0
        raise ProtocolError(f"{what} CRC must be 0x{crc16(data[1:-2]):04X}, not "
                            f"0x{data[-2] << 8 | data[-1]:04X}: the bytes were corrupted on "
                            f"the way (or the board speaks another protocol version)")
    return data[1:head - 2], data[head:-CRC_BYTES]


def encode_frame(cmd: int, payload: bytes = b"", seq: int = 0) -> bytes:
    """Host -> device frame ``A5 cmd seq len_lo len_hi payload crc_hi crc_lo``."""
    return _encode(FRAME_SYNC, bytes([cmd, seq]), payload)


def decode_frame(data: bytes) -> "tuple[int, int, bytes]":
    """Split one whole host -> device frame into ``(cmd, seq, payload)``; raise
    :class:`ProtocolError` if it is malformed."""
    (cmd, seq), payload = _decode(data, FRAME_SYNC, FRAME_HEAD, "Frame")
    return cmd, seq, payload


def encode_reply(status: int, cmd: int, seq: int, payload: bytes = b"") -> bytes:
    """Device -> host reply ``5A status cmd seq len_lo len_hi payload crc_hi crc_lo``: the
    command byte and sequence number echo the frame's."""
    return _encode(REPLY_SYNC, bytes([status, cmd, seq]), payload)


def decode_reply(data: bytes) -> "tuple[int, int, int, bytes]":
    """Split one whole device -> host reply into ``(status, cmd, seq, payload)``; raise
    :class:`ProtocolError` if it is malformed."""
    (status, cmd, seq), payload = _decode(data, REPLY_SYNC, REPLY_HEAD, "Reply")
    return status, cmd, seq, payload


_INFO = "<BBBHI"          # after MAGIC: version, rows, cols, act_depth, build_id


@dataclass(frozen=True)
class DeviceInfo:
    """What ``INFO`` reports: the protocol version, the array geometry, the activation buffer
    depth and the 32-bit build id the bitstream was made with."""
    version: int
    rows: int
    cols: int
    act_depth: int
    build_id: int

    @classmethod
    def decode(cls, payload: bytes) -> "DeviceInfo":
        if len(payload) != 4 + struct.calcsize(_INFO) or payload[:4] != MAGIC:
            raise ProtocolError(f"INFO reply payload must be 13 bytes starting with {MAGIC!r}, "
                                f"not {bytes(payload)!r}")
        version, rows, cols, act_depth, build_id = struct.unpack(_INFO, payload[4:])
        return cls(version, rows, cols, act_depth, build_id)

    def encode(self) -> bytes:
        return MAGIC + struct.pack(_INFO, self.version, self.rows, self.cols,
                                   self.act_depth, self.build_id)


@dataclass(frozen=True)
class DeviceStatus:
    """What ``STATUS`` reports: the accelerator's ``busy`` and ``done`` flags, the cycle
    count of its last run, and on a build with an external memory whether the memory is up
    (``memory_ready``) or failed to come up (``memory_failed``: its reads found no working
    delay)."""
    busy: bool
    done: bool
    cycles: int
    memory_ready: bool = False
    memory_failed: bool = False


class Client:
    """Talk to a board's host bridge over ``transport``.

    One command is outstanding at a time: every method sends one frame (or several, for
    transfers longer than one frame allows) and waits for its reply.

    Parameters
    ----------
    transport : object
        Has ``write(data: bytes)`` and ``read(n: int) -> bytes``; ``read`` blocks until ``n``
        bytes arrived and may raise on a timeout (returning fewer bytes is reported as a
        timeout).

    Raises
    ------
    ProtocolError
        From every method: the reply is malformed, its status is not OK, or it is short.
    """

    def __init__(self, transport):
        self.transport = transport
        self._info: "DeviceInfo | None" = None
        self._seq = 0                       # the next frame's sequence number

    def command(self, cmd: int, payload: bytes = b"") -> bytes:
        """Send one frame and return the payload of its OK reply, which must echo the
        frame's command and sequence number."""
        seq, self._seq = self._seq, (self._seq + 1) & 0xFF
        self.transport.write(encode_frame(cmd, payload, seq))
        head = self._read(REPLY_HEAD)
        if head[0] != REPLY_SYNC:
            raise ProtocolError(f"Reply must start with 0x{REPLY_SYNC:02X}, not "
                                f"0x{head[0]:02X}; is this an hwonnx board?")
        length = head[-2] | head[-1] << 8
        status, echo_cmd, echo_seq, payload = decode_reply(head + self._read(length + CRC_BYTES))
        name = _command_name(cmd)
        if status == Status.BAD_CRC:   # the echo may be of the corrupted bytes
            raise ProtocolError(f"Device rejected {name}: status 0x{status:02X} "
                                f"({_STATUS_TEXT[status]})")
        if (echo_cmd, echo_seq) != (cmd, seq):
            raise ProtocolError(f"Reply to {name} #{seq} answers {_command_name(echo_cmd)} "
                                f"#{echo_seq}: the link is out of step (a reply was lost, "
                                f"repeated or delayed); reset the board and run again")
        if status != Status.OK:
            text = _STATUS_TEXT.get(status, "the status is unknown")
            raise ProtocolError(f"Device rejected {name}: status 0x{status:02X} ({text})")
        return payload

    def _read(self, n: int) -> bytes:
        data = bytes(self.transport.read(n))
        if len(data) != n:
            raise ProtocolError(f"Device timed out: expected {n} bytes, received {len(data)}")
        return data

    def info(self) -> DeviceInfo:
        """Ask the device for its :class:`DeviceInfo` (and remember it for transfers)."""
        self._info = DeviceInfo.decode(self.command(Command.INFO))
        if self._info.version != PROTOCOL_VERSION:
            raise ProtocolError(f"Device speaks protocol version {self._info.version}, but "
                                f"this host speaks version {PROTOCOL_VERSION}")
        return self._info

    def verify(self, config: ArchConfig, build_id: int) -> DeviceInfo:
        """Check that the device is the build ``build_id`` of ``config``."""
        info = self.info()
        if (info.rows, info.cols, info.act_depth) != (config.rows, config.cols,
                                                      config.act_depth):
            raise ProtocolError(
                f"Device array must be {config.rows}x{config.cols} with {config.act_depth} "
                f"activation words, not {info.rows}x{info.cols} with {info.act_depth}")
        if info.build_id != build_id:
            raise ProtocolError(f"Device build id must be 0x{build_id:08X}, not "
                                f"0x{info.build_id:08X}; program the board with this build")
        return info

    def _rows(self) -> int:
        return (self._info or self.info()).rows

    def write_words(self, addr: int, data: bytes) -> None:
        """Write ``len(data) // rows`` activation words from word ``addr`` on."""
        rows, data = self._rows(), bytes(data)
        if len(data) % rows:
            raise ValueError(f"Data must be a whole number of {rows}-byte words, not "
                             f"{len(data)} bytes")
        _check_address(addr, len(data) // rows)
        per_frame = (MAX_PAYLOAD - 2) // rows
        for first in range(0, len(data) // rows, per_frame):
            chunk = data[first * rows:(first + per_frame) * rows]
            self.command(Command.WRITE, struct.pack("<H", addr + first) + chunk)

    def load_program(self, words: "list[int]", width: int) -> None:
        """Write the program-memory ``words`` of ``width`` bits from word 0 on (``LOAD``; only
        boards whose program memory is loaded at run time accept it)."""
        size = width // 8
        data = b"".join(int(w).to_bytes(size, "little") for w in words)
        _check_address(0, len(words))
        per_frame = (MAX_PAYLOAD - 2) // size
        for first in range(0, len(words), per_frame):
            chunk = data[first * size:(first + per_frame) * size]
            self.command(Command.LOAD, struct.pack("<H", first) + chunk)

    def write_external(self, words: "list[int]", width: int, addr: int = 0) -> None:
        """Write ``words`` of ``width`` bits into the external memory from word ``addr`` on
        (``WRITEX``; only builds with an external memory accept it)."""
        size = width // 8
        if not 0 <= addr or addr + len(words) > 1 << 32:
            raise ValueError(f"Words [{addr}, {addr + len(words)}) must lie within the 32-bit "
                             f"address space")
        data = b"".join(int(w).to_bytes(size, "little") for w in words)
        per_frame = (MAX_PAYLOAD - 4) // size
        for first in range(0, len(words), per_frame):
            chunk = data[first * size:(first + per_frame) * size]
            self.command(Command.WRITEX, struct.pack("<I", addr + first) + chunk)

    def read_external(self, addr: int, count: int, width: int) -> bytes:
        """Read ``count`` external-memory words of ``width`` bits from word ``addr`` on
        (``READX``; only builds with an external memory accept it): ``count * width // 8``
        bytes, each word least significant byte first."""
        size = width // 8
        if not 0 <= addr or not 0 <= count or addr + count > 1 << 32:
            raise ValueError(f"Words [{addr}, {addr + count}) must lie within the 32-bit "
                             f"address space")
        return self._read_words(Command.READX, "<IH", addr, count, size)

    def sum_external(self, addr: int, count: int) -> "tuple[int, int]":
        """The Fletcher sums (:func:`external_sums`) of ``count`` external-memory words from
        word ``addr`` on, which the board computes (``SUMX``; only builds with an external
        memory accept it): the host checks the memory without reading it back."""
        if not 0 <= addr or not 0 <= count < 1 << 16 or addr + count > 1 << 32:
            raise ValueError(f"Words [{addr}, {addr + count}) must lie within the 32-bit "
                             f"address space, at most 65535 of them")
        payload = self.command(Command.SUMX, struct.pack("<IH", addr, count))
        if len(payload) != 8:
            raise ProtocolError(f"SUMX reply payload must be 8 bytes, not {len(payload)}")
        return struct.unpack("<II", payload)

    def read_words(self, addr: int, count: int) -> bytes:
        """Read ``count`` activation words from word ``addr`` on (``count * rows`` bytes)."""
        rows = self._rows()
        _check_address(addr, count)
        return self._read_words(Command.READ, "<HH", addr, count, rows)

    def _read_words(self, cmd: Command, layout: str, addr: int, count: int,
                    size: int) -> bytes:
        """``count`` words of ``size`` bytes from ``addr`` on, in as many ``cmd`` frames
        (payload: address and count packed as ``layout``) as the replies' length needs."""
        per_frame = MAX_PAYLOAD // size
        data = b""
        for first in range(0, count, per_frame):
            n = min(per_frame, count - first)
            data += self.command(cmd, struct.pack(layout, addr + first, n))
            if len(data) != (first + n) * size:
                raise ProtocolError(f"{cmd.name} reply must carry {n * size} bytes, not "
                                    f"{len(data) - first * size}")
        return data

    def run(self) -> int:
        """Start the accelerator, wait until it is done and return its cycle count."""
        payload = self.command(Command.RUN)
        if len(payload) != 4:
            raise ProtocolError(f"RUN reply payload must be 4 bytes, not {len(payload)}")
        return struct.unpack("<I", payload)[0]

    def status(self) -> DeviceStatus:
        """Return the accelerator's :class:`DeviceStatus`."""
        payload = self.command(Command.STATUS)
        if len(payload) != 5:
            raise ProtocolError(f"STATUS reply payload must be 5 bytes, not {len(payload)}")
        flags, cycles = struct.unpack("<BI", payload)
        return DeviceStatus(busy=bool(flags & 1), done=bool(flags & 2), cycles=cycles,
                            memory_ready=bool(flags & 4), memory_failed=bool(flags & 8))


#: Bits a byte takes on the wire (8N1: a start bit, eight data bits, a stop bit).
BITS_PER_BYTE = 10


def transfer_bytes(rows: int, written_words: int, read_words: int) -> int:
    """Bytes on the wire, both ways, to write ``written_words`` activation words and read
    ``read_words`` back as :meth:`Client.write_words` and :meth:`Client.read_words` frame them
    (each frame: sync, command, sequence, 16-bit length, payload, CRC; each reply: sync,
    status, command, sequence, 16-bit length, payload, CRC)."""
    frame, reply = FRAME_HEAD + CRC_BYTES, REPLY_HEAD + CRC_BYTES
    total = 0
    per_write = (MAX_PAYLOAD - 2) // rows
    for first in range(0, written_words, per_write):
        n = min(per_write, written_words - first)
        total += frame + 2 + n * rows + reply   # WRITE addr + words; empty OK reply
    per_read = MAX_PAYLOAD // rows
    for first in range(0, read_words, per_read):
        n = min(per_read, read_words - first)
        total += frame + 4 + reply + n * rows   # READ addr, count; reply with the words
    return total


def _check_address(addr: int, count: int) -> None:
    if not 0 <= addr or not 0 <= count or addr + count > 0x10000:
        raise ValueError(f"Words [{addr}, {addr + count}) must lie within the 16-bit address "
                         f"space")


def _command_name(cmd: int) -> str:
    try:
        return Command(cmd).name
    except ValueError:
        return f"command 0x{cmd:02X}"
