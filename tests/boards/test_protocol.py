"""The host-link protocol in pure Python: frame and reply encoding, the Client against a
Python model of the device, and the pyserial transport (over pyserial's ``loop://``)."""

import re
import struct
import sys

import numpy as np
import pytest

from hwonnx.boards.host import SerialTransport
from hwonnx.boards.protocol import (
    MAX_PAYLOAD, PROTOCOL_VERSION, Client, Command, DeviceInfo, DeviceStatus, ProtocolError,
    Status, crc16, decode_frame, decode_reply, encode_frame, encode_reply, external_sums,
)
from hwonnx.config import ArchConfig
from hwonnx.errors import HwonnxError, ToolchainError, UsageError


class FakeDevice:
    """What the bridge does, in Python, behind a transport: one frame per ``write``."""

    def __init__(self, rows=3, act_depth=40, build_id=7, cycles=1234, version=PROTOCOL_VERSION):
        self.rows, self.act_depth, self.cycles = rows, act_depth, cycles
        self.info = DeviceInfo(version, rows, 2, act_depth, build_id)
        self.mem = bytearray(rows * act_depth)
        self.frames, self.seqs, self.out, self.done = [], [], bytearray(), False

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
        cmd, seq, payload = decode_frame(data)
        self.frames.append((cmd, payload))
        self.seqs.append(seq)
        status, reply = self.execute(cmd, payload)
        self.out += encode_reply(status, cmd, seq, reply)

    def read(self, n):
        data = bytes(self.out[:n])
        del self.out[:n]
        return data


def test_frame_layout_and_crc():
    """The CRC is CRC-16/CCITT-FALSE, sent high byte first (its check value, the CRC of
    b"123456789", is 0x29B1 in the catalogue of parametrised CRC algorithms)."""
    assert crc16(b"123456789") == 0x29B1 and crc16(b"") == 0xFFFF
    frame = encode_frame(Command.READ, struct.pack("<HH", 1, 2), seq=0x11)
    assert frame[:9] == bytes.fromhex("a5 02 11 04 00 01 00 02 00")
    assert frame[9:] == crc16(frame[1:9]).to_bytes(2, "big") and crc16(frame[1:]) == 0
    reply = encode_reply(Status.BAD_LENGTH, Command.RUN, 0xFE)
    assert reply[:6] == bytes.fromhex("5a 03 03 fe 00 00")
    assert reply[6:] == crc16(reply[1:6]).to_bytes(2, "big")


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
        payload, (head, cmd, seq) = rng.bytes(size), rng.integers(0, 256, 3).tolist()
        frame, reply = encode_frame(cmd, payload, seq), encode_reply(head, cmd, seq, payload)
        assert crc16(frame[1:]) == 0 and crc16(reply[1:]) == 0
        assert decode_frame(frame) == (cmd, seq, payload)
        assert decode_reply(reply) == (head, cmd, seq, payload)
    info = DeviceInfo(PROTOCOL_VERSION, 64, 64, 0xFFFF, 0xFFFFFFFF)
    assert len(info.encode()) == 13 and DeviceInfo.decode(info.encode()) == info


@pytest.mark.parametrize("data, message", [
    (bytes(7), r"^Reply must be at least 8 bytes long, not 7$"),
    (b"\xa5" + bytes(7), r"^Reply must start with 0x5A, not 0xA5$"),
    (b"\x5a\x00\x00\x00\x02\x00\x00\x00\x00", r"^Reply with a 2-byte payload must be 10 bytes "
                                             r"long, not 9$"),
    (b"\x5a\x00\x00\x00\x01\x00\x07\x12\x34", r"^Reply CRC must be 0x[0-9A-F]{4}, not 0x1234: "
                                             r"the bytes were corrupted on the way \(or the "
                                             r"board speaks another protocol version\)$"),
])
def test_decode_reply_errors(data, message):
    with pytest.raises(ProtocolError, match=message):
        decode_reply(data)


def test_the_crc_catches_what_a_sum_misses():
    """Two bytes swapped, or +1 on one byte and -1 on another, keep the sum of the bytes (the
    version 1 check byte) but not the CRC."""
    reply = encode_reply(Status.OK, Command.READ, 3, bytes([10, 20, 30, 40]))
    for damaged in (reply[:6] + bytes([20, 10, 30, 40]) + reply[10:],
                    reply[:6] + bytes([11, 20, 29, 40]) + reply[10:]):
        assert sum(damaged) == sum(reply)
        with pytest.raises(ProtocolError, match=r"^Reply CRC must be "):
            decode_reply(damaged)


def test_decode_frame_and_info_errors():
    with pytest.raises(ProtocolError, match=r"^Frame must start with 0xA5, not 0x5A$"):
        decode_frame(encode_reply(0, 0, 0))
    with pytest.raises(ProtocolError, match=r"^INFO reply payload must be 13 bytes starting "
                                            r"with b'HWNX', not b'HWNX\\x01'$"):
        DeviceInfo.decode(b"HWNX\x01")
    with pytest.raises(ValueError, match=r"^Payload must be at most 65535 bytes, not 65536$"):
        encode_frame(Command.WRITE, bytes(MAX_PAYLOAD + 1))
    assert issubclass(ProtocolError, HwonnxError)


def test_client_commands():
    device = FakeDevice()
    client = Client(device)
    assert client.info() == DeviceInfo(PROTOCOL_VERSION, 3, 2, 40, 7)
    assert client.status() == DeviceStatus(busy=False, done=False, cycles=0)
    client.write_words(5, bytes(range(9)))
    assert device.mem[15:24] == bytes(range(9))
    assert client.read_words(5, 4) == bytes(range(9)) + bytes(3)
    assert client.run() == 1234
    assert client.status() == DeviceStatus(busy=False, done=True, cycles=1234)
    client.write_words(3, b"")
    assert client.read_words(3, 0) == b""
    assert [cmd for cmd, _ in device.frames] == [0, 4, 1, 2, 3, 4]
    assert device.seqs == [0, 1, 2, 3, 4, 5]             # one number per frame, in order
    for _ in range(252):
        client.status()
    assert device.seqs[-3:] == [255, 0, 1]               # modulo 256


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
    with pytest.raises(ProtocolError, match=rf"^Device speaks protocol version 1, but this "
                                            rf"host speaks version {PROTOCOL_VERSION}$"):
        Client(FakeDevice(version=1)).info()


class Scripted:                         # replies with fixed bytes, whatever is asked
    def __init__(self, reply):
        self.reply = bytearray(reply)

    def write(self, data):
        pass

    def read(self, n):
        data = bytes(self.reply[:n])
        del self.reply[:n]
        return data


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

    run = Command.RUN
    cases = [
        (b"", r"^Device timed out: expected 6 bytes, received 0$"),
        (encode_reply(0, run, 0, b"abc")[:8], r"^Device timed out: expected 5 bytes, received "
                                              r"2$"),
        (b"\x00\x5a\x00\x00\x00\x00", r"^Reply must start with 0x5A, not 0x00; is this an "
                                      r"hwonnx board\?$"),
        (encode_reply(0x42, run, 0), r"^Device rejected RUN: status 0x42 \(the status is "
                                     r"unknown\)$"),
        (encode_reply(0, run, 0, b"\x01\x02"), r"^RUN reply payload must be 4 bytes, not 2$"),
        # the reply of another command, or of an earlier frame: the link is out of step
        (encode_reply(0, Command.READ, 0, bytes(4)), r"^Reply to RUN #0 answers READ #0: the "
                                                      r"link is out of step \(a reply was lost, "
                                                      r"repeated or delayed\); reset the board "
                                                      r"and run again$"),
        (encode_reply(0, run, 255, bytes(4)), r"^Reply to RUN #0 answers RUN #255: the link "),
        (encode_reply(Status.BAD_LENGTH, run, 9), r"^Reply to RUN #0 answers RUN #9: "),
        # a frame whose CRC failed may have had its command or sequence number corrupted
        (encode_reply(Status.BAD_CRC, 0x13, 9), r"^Device rejected RUN: status 0x01 \(the "
                                                r"frame's CRC was wrong: it was corrupted on "
                                                r"the way\)$"),
    ]
    for reply, message in cases:
        with pytest.raises(ProtocolError, match=message):
            Client(Scripted(reply)).run()
    with pytest.raises(ProtocolError, match=r"^STATUS reply payload must be 5 bytes, not 0$"):
        Client(Scripted(encode_reply(0, Command.STATUS, 0))).status()


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


def test_serial_transport_reports_a_port_that_went_away():
    """A USB-serial board unplugged mid-run fails in tcdrain (termios.error, a bare tuple),
    in the OS (OSError) or in pyserial: each is one ProtocolError naming the port."""
    import termios

    import serial

    class Gone:
        def __init__(self, error):
            self.error, self.timeout, self.write_timeout = error, 1, 1

        def write(self, data):
            return len(data)

        def flush(self):
            raise self.error

        def read(self, n):
            raise self.error

        close = flush

    for error, text in [(termios.error(5, "Input/output error"), "Input/output error (errno 5)"),
                        (OSError(5, "Input/output error"), "[Errno 5] Input/output error"),
                        (serial.SerialException("read failed"), "read failed")]:
        transport = SerialTransport("loop://", timeout=0.01)
        transport._serial = Gone(error)
        message = rf"^Serial port 'loop://' failed: {re.escape(text)}$"
        with pytest.raises(ProtocolError, match=message):
            transport.write(b"\x01")
        with pytest.raises(ProtocolError, match=message):
            transport.read(1)
        transport.close()                   # nothing left to close: no error either
