"""The host-link protocol in pure Python: frame and reply encoding, the Client against a
Python model of the device, and the pyserial transport (over pyserial's ``loop://``)."""

import struct
import sys

import numpy as np
import pytest

from hwonnx.boards.host import SerialTransport
from hwonnx.boards.protocol import (
    MAX_PAYLOAD, Client, Command, DeviceInfo, DeviceStatus, ProtocolError, Status, checksum,
    decode_frame, decode_reply, encode_frame, encode_reply, external_sums,
)
from hwonnx.config import ArchConfig
from hwonnx.errors import HwonnxError, ToolchainError, UsageError


class FakeDevice:
    """What the bridge does, in Python, behind a transport: one frame per ``write``."""

    def __init__(self, rows=3, act_depth=40, build_id=7, cycles=1234, version=1):
        self.rows, self.act_depth, self.cycles = rows, act_depth, cycles
        self.info = DeviceInfo(version, rows, 2, act_depth, build_id)
        self.mem = bytearray(rows * act_depth)
        self.frames, self.out, self.done = [], bytearray(), False

    def execute(self, cmd, payload):
        rows = self.rows
        if cmd == Command.INFO:
            return Status.OK, self.info.encode()
        if cmd == Command.WRITE:
            addr = struct.unpack_from("<H", payload)[0]
            if addr + (len(payload) - 2) // rows > self.act_depth:
                return Status.ADDRESS_RANGE, b""
            self.mem[addr * rows:addr * rows + len(payload) - 2] = payload[2:]
            return Status.OK, b""
        if cmd == Command.READ:
            addr, count = struct.unpack("<HH", payload)
            return Status.OK, bytes(self.mem[addr * rows:(addr + count) * rows])
        if cmd == Command.RUN:
            self.done = True
            return Status.OK, struct.pack("<I", self.cycles)
        if cmd == Command.STATUS:
            return Status.OK, struct.pack("<BI", 2 * self.done, self.cycles * self.done)
        return Status.UNKNOWN_COMMAND, b""

    def write(self, data):
        cmd, payload = decode_frame(data)
        self.frames.append((cmd, payload))
        self.out += encode_reply(*self.execute(cmd, payload))

    def read(self, n):
        data = bytes(self.out[:n])
        del self.out[:n]
        return data


def test_frame_layout_and_checksum():
    frame = encode_frame(Command.READ, struct.pack("<HH", 1, 2))
    assert frame == bytes.fromhex("a5 02 04 00 01 00 02 00 f7")
    assert encode_reply(Status.OK) == bytes.fromhex("5a 00 00 00 00")
    assert encode_reply(Status.BAD_LENGTH) == bytes.fromhex("5a 03 00 00 fd")
    assert checksum(b"") == 0 and checksum(b"\x01") == 0xFF and checksum(b"\x80\x80") == 0


def test_external_sums_are_fletcher_sums_of_32_bit_chunks():
    """By hand: the 64-bit words 1 and 2 are the chunks 1, 0, 2, 0: a = 1, 1, 3, 3 and
    b = 1, 2, 5, 8; a 48-bit word's upper chunk is its top 16 bits."""
    assert external_sums([1, 2], 64) == (3, 8)
    assert external_sums([(5 << 32) | 7], 48) == (12, 19)
    assert external_sums([0xFFFFFFFF, 1], 32) == (0, 0xFFFFFFFF)
    assert external_sums([], 64) == (0, 0)


def test_round_trips():
    rng = np.random.default_rng(0)
    for size in [0, 1, 2, 255, 256, 1000, MAX_PAYLOAD]:
        payload, head = rng.bytes(size), int(rng.integers(0, 256))
        frame, reply = encode_frame(head, payload), encode_reply(head, payload)
        assert sum(frame[1:]) % 256 == 0 and sum(reply[1:]) % 256 == 0
        assert decode_frame(frame) == (head, payload)
        assert decode_reply(reply) == (head, payload)
    info = DeviceInfo(1, 64, 64, 0xFFFF, 0xFFFFFFFF)
    assert len(info.encode()) == 13 and DeviceInfo.decode(info.encode()) == info


@pytest.mark.parametrize("data, message", [
    (b"\x5a\x00\x00\x00", r"^Reply must be at least 5 bytes long, not 4$"),
    (b"\xa5\x00\x00\x00\x00", r"^Reply must start with 0x5A, not 0xA5$"),
    (b"\x5a\x00\x02\x00\x00\xfe", r"^Reply with a 2-byte payload must be 7 bytes long, not 6$"),
    (b"\x5a\x00\x01\x00\x07\xf7", r"^Reply checksum must be 0xF8, not 0xF7$"),
])
def test_decode_reply_errors(data, message):
    with pytest.raises(ProtocolError, match=message):
        decode_reply(data)


def test_decode_frame_and_info_errors():
    with pytest.raises(ProtocolError, match=r"^Frame must start with 0xA5, not 0x5A$"):
        decode_frame(encode_reply(0))
    with pytest.raises(ProtocolError, match=r"^INFO reply payload must be 13 bytes starting "
                                            r"with b'HWNX', not b'HWNX\\x01'$"):
        DeviceInfo.decode(b"HWNX\x01")
    with pytest.raises(ValueError, match=r"^Payload must be at most 65535 bytes, not 65536$"):
        encode_frame(Command.WRITE, bytes(MAX_PAYLOAD + 1))
    assert issubclass(ProtocolError, HwonnxError)


def test_client_commands():
    device = FakeDevice()
    client = Client(device)
    assert client.info() == DeviceInfo(1, 3, 2, 40, 7)
    assert client.status() == DeviceStatus(busy=False, done=False, cycles=0)
    client.write_words(5, bytes(range(9)))
    assert device.mem[15:24] == bytes(range(9))
    assert client.read_words(5, 4) == bytes(range(9)) + bytes(3)
    assert client.run() == 1234
    assert client.status() == DeviceStatus(busy=False, done=True, cycles=1234)
    client.write_words(3, b"")
    assert client.read_words(3, 0) == b""
    assert [cmd for cmd, _ in device.frames] == [0, 4, 1, 2, 3, 4]


def test_client_splits_long_transfers_into_frames():
    device = FakeDevice(rows=64, act_depth=3000)
    client = Client(device)
    data = np.random.default_rng(1).bytes(64 * 2500)
    client.write_words(100, data)
    assert [len(p) for c, p in device.frames if c == Command.WRITE] == [2 + 64 * 1023] * 2 + [
        2 + 64 * 454]
    assert [p[:2] for c, p in device.frames if c == Command.WRITE] == [
        struct.pack("<H", a) for a in (100, 1123, 2146)]
    assert client.read_words(100, 2500) == data
    assert [p for c, p in device.frames if c == Command.READ] == [
        struct.pack("<HH", 100, 1023), struct.pack("<HH", 1123, 1023),
        struct.pack("<HH", 2146, 454)]


def test_client_verify():
    client = Client(FakeDevice(build_id=0x1234))
    config = ArchConfig(rows=3, cols=2, act_depth=40)
    assert client.verify(config, 0x1234).build_id == 0x1234
    with pytest.raises(ProtocolError, match=r"^Device build id must be 0x00001235, not "
                                            r"0x00001234; program the board with this build$"):
        client.verify(config, 0x1235)
    with pytest.raises(ProtocolError, match=r"^Device array must be 8x8 with 8192 activation "
                                            r"words, not 3x2 with 40$"):
        client.verify(ArchConfig(), 0x1234)
    with pytest.raises(ProtocolError, match=r"^Device speaks protocol version 2, but this host "
                                            r"speaks version 1$"):
        Client(FakeDevice(version=2)).info()


def test_client_errors():
    client = Client(FakeDevice())
    with pytest.raises(ProtocolError, match=r"^Device rejected WRITE: status 0x04 \(the words "
                                            r"are outside the buffer\)$"):
        client.write_words(39, bytes(6))
    with pytest.raises(ProtocolError, match=r"^Device rejected command 0x09: status 0x02 "
                                            r"\(the command is unknown\)$"):
        client.command(9)
    with pytest.raises(ValueError, match=r"^Data must be a whole number of 3-byte words, not "
                                         r"4 bytes$"):
        client.write_words(0, bytes(4))
    with pytest.raises(ValueError, match=r"^Words \[65535, 65537\) must lie within the 16-bit "
                                         r"address space$"):
        client.read_words(0xFFFF, 2)

    class Scripted:                     # replies with fixed bytes, whatever is asked
        def __init__(self, reply):
            self.reply = bytearray(reply)

        def write(self, data):
            pass

        def read(self, n):
            data = bytes(self.reply[:n])
            del self.reply[:n]
            return data

    cases = [
        (b"", r"^Device timed out: expected 4 bytes, received 0$"),
        (encode_reply(0, b"abc")[:6], r"^Device timed out: expected 4 bytes, received 2$"),
        (b"\x00\x5a\x00\x00", r"^Reply must start with 0x5A, not 0x00; is this an hwonnx "
                              r"board\?$"),
        (encode_reply(0x42), r"^Device rejected RUN: status 0x42 \(the status is unknown\)$"),
        (encode_reply(0, b"\x01\x02"), r"^RUN reply payload must be 4 bytes, not 2$"),
    ]
    for reply, message in cases:
        with pytest.raises(ProtocolError, match=message):
            Client(Scripted(reply)).run()
    with pytest.raises(ProtocolError, match=r"^STATUS reply payload must be 5 bytes, not 0$"):
        Client(Scripted(encode_reply(0))).status()


def test_serial_transport_over_loopback():
    with SerialTransport("loop://", baudrate=115200, timeout=0.01) as transport:
        transport.write(b"\x01\x02\x03")
        assert transport.read(3) == b"\x01\x02\x03"
        with pytest.raises(ProtocolError, match=r"^Serial port 'loop://' timed out after "
                                                r"0\.01 s: expected 2 bytes, received 0$"):
            transport.read(2)
        # A loopback echoes the frame: the client notices it is not talking to a bridge.
        with pytest.raises(ProtocolError, match=r"^Reply must start with 0x5A, not 0xA5; is "
                                                r"this an hwonnx board\?$"):
            Client(transport).info()


def test_serial_transport_errors(monkeypatch):
    with pytest.raises(UsageError, match=r"^Cannot open serial port 'nonsense://x': "):
        SerialTransport("nonsense://x")
    monkeypatch.setitem(sys.modules, "serial", None)        # as if pyserial were missing
    with pytest.raises(ToolchainError, match=r"^Talking to a board needs pyserial; install it "
                                             r"with 'pip install pyserial'$"):
        SerialTransport("loop://")
