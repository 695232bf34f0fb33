"""``hwonnx run`` against faulty boards on a pseudo-terminal: pyserial opens the terminal's
far end as it opens a USB-serial port, and a thread on the near end plays a board that runs
the build (``FakeBoard``: the golden model and the predicted cycles) but damages, repeats,
delays or drops what it sends. Every case must end with a one-line error, in bounded time,
without writing the outputs; an honest board's run ends with the golden model's outputs."""

import os
import select
import struct
import threading
import time

import numpy as np
import pytest

from hwonnx.api import build, simulate
from hwonnx.boards import host, protocol
from hwonnx.boards.build import build_id
from hwonnx.cli import main
from hwonnx.examples import example_path, load_digits_data

from tests.boards.test_run_board import FakeBoard

Command = protocol.Command


class PtyBoard:
    """The near end of a pseudo-terminal playing a board: it reads whole frames, has
    ``FakeBoard`` answer them, and passes each reply through ``fault(cmd, reply, board)``,
    which returns the bytes to send (or ``None`` to close the terminal at once: the board is
    unplugged; a fault that sets ``unplug`` closes it after sending). ``byte_time`` seconds
    pass before each byte it sends."""

    def __init__(self, board: FakeBoard, fault=None, byte_time: float = 0.0):
        self.board, self.fault, self.byte_time = board, fault, byte_time
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)
        self.stop = threading.Event()
        self.commands: "list[int]" = []
        self.unplug = False
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass            # already closed: the board was unplugged

    def _read(self, n: int) -> "bytes | None":
        data = b""
        while len(data) < n:
            if self.stop.is_set():
                return None
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    data += os.read(self.master, n - len(data))
                except OSError:
                    return None
        return data

    def _serve(self):
        while not self.stop.is_set():
            head = self._read(1)
            if head is None:
                return
            if head[0] != protocol.FRAME_SYNC:
                continue
            rest = self._read(protocol.FRAME_HEAD - 1)
            if rest is None:
                return
            length = rest[-2] | rest[-1] << 8
            tail = self._read(length + protocol.CRC_BYTES)
            if tail is None:
                return
            frame = head + rest + tail
            self.commands.append(frame[1])
            self.board.write(frame)
            reply, self.board.pending = self.board.pending, b""
            if self.fault is not None:
                reply = self.fault(frame[1], reply, self)
            if reply is None:               # unplugged
                os.close(self.master)
                return
            for byte in reply:
                if self.byte_time:
                    if self.stop.wait(self.byte_time):
                        return
                os.write(self.master, bytes([byte]))
            if self.unplug:
                os.close(self.master)
                return


@pytest.fixture(scope="module")
def board_build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ulx3s")
    data = load_digits_data()
    result = build(example_path("digits_mlp"), folder, board="ulx3s-85f",
                   calib={"image": data["calib"]}, verilog=False, log=lambda message: None)
    np.save(folder / "x.npy", data["test_images"][:3])
    return folder, result


def run_against(folder, result, capsys, fault=None, byte_time=0.0, ident=None, cycles=None,
                extra=()):
    """``hwonnx run`` of the build in ``folder`` on a pseudo-terminal board; the exit code,
    stdout and stderr, and the seconds it took."""
    out = folder / "y.npz"
    out.unlink(missing_ok=True)
    board = FakeBoard(result, build_id(result.program) if ident is None else ident, cycles)
    with PtyBoard(board, fault, byte_time) as pty:
        start = time.monotonic()
        code = main(["run", str(folder), "--port", pty.path, "--input", str(folder / "x.npy"),
                     "--output", str(out), *extra])
        seconds = time.monotonic() - start
    captured = capsys.readouterr()
    return code, captured.out, captured.err, seconds


def assert_refused(code, err, seconds, folder, message):
    """Exit code 2, an error of one line holding ``message`` ending stderr (after the
    progress lines), no outputs, within 20 s."""
    assert code == 2, err
    *progress, error = err.splitlines()
    assert error.startswith("hwonnx: error: ") and message in error, err
    assert not any("error" in line or "Traceback" in line for line in progress), err
    assert not (folder / "y.npz").exists()
    assert seconds < 20


def test_an_honest_board_on_a_pseudo_terminal(board_build, capsys):
    folder, result = board_build
    code, out, err, _ = run_against(folder, result, capsys)
    assert code == 0, err
    golden = simulate(folder, folder / "x.npy", mode="golden")
    with np.load(folder / "y.npz") as npz:
        np.testing.assert_array_equal(npz["logits"], golden.outputs["logits"])
    assert f"3 sample(s) on the board: {golden.predicted_cycles:,} cycles per sample" in out


def _on(command, change):
    """A fault that changes the reply to every ``command`` (a READ, a RUN ...) by
    ``change(reply)``, and leaves the others alone."""
    return lambda cmd, reply, pty: change(reply) if cmd == command else reply


def _payload(reply: bytes, edit) -> bytes:
    """``reply`` with its payload bytes edited in place (``edit(bytearray)``), CRC unchanged:
    damage on the wire."""
    head, payload = reply[:protocol.REPLY_HEAD], bytearray(reply[protocol.REPLY_HEAD:-2])
    edit(payload)
    return head + bytes(payload) + reply[-2:]


def _swap(payload):
    payload[0], payload[1] = payload[1], payload[0]


def _plus_minus(payload):
    payload[0] = (payload[0] + 1) & 0xFF
    payload[1] = (payload[1] - 1) & 0xFF


def _previous_read():
    """Every READ answered with the reply to the one before (the first one honestly)."""
    kept = []

    def fault(cmd, reply, pty):
        if cmd != Command.READ:
            return reply
        kept.append(reply)
        return kept[-2] if len(kept) > 1 else reply
    return fault


def _twice_once():
    """The reply to the first WRITE sent twice: from then on every reply is one behind, each
    of the length the host expects for the command before."""
    sent = []

    def fault(cmd, reply, pty):
        if cmd == Command.WRITE and not sent:
            sent.append(reply)
            return reply + reply
        return reply
    return fault


def _unplug(command):
    return lambda cmd, reply, pty: None if cmd == command else reply


def _unplug_after(command):
    def fault(cmd, reply, pty):
        pty.unplug = pty.unplug or cmd == command
        return reply
    return fault


def _run_reply(cycles: int):
    return _on(Command.RUN, lambda reply: protocol.encode_reply(
        0, Command.RUN, reply[3], struct.pack("<I", cycles)))


@pytest.mark.parametrize("fault, message", [
    pytest.param(_on(Command.READ, lambda r: _payload(r, _swap)),
                 "Reply CRC must be 0x", id="two-bytes-swapped"),
    pytest.param(_on(Command.READ, lambda r: _payload(r, _plus_minus)),
                 "Reply CRC must be 0x", id="plus-one-minus-one"),
    pytest.param(_previous_read(), "Reply to READ #6 answers READ #3: the link is out of step",
                 id="previous-sample-reply"),
    pytest.param(_twice_once(), "Reply to RUN #2 answers WRITE #1: the link is out of step",
                 id="desynchronized"),
    pytest.param(_on(Command.READ, lambda r: r[:-3]), "timed out after",
                 id="truncated"),
    pytest.param(_on(Command.RUN, lambda r: b""), "timed out after", id="silence"),
    pytest.param(_on(Command.INFO, lambda r: bytes(range(1, 200))),
                 "Reply must start with 0x5A, not 0x01; is this an hwonnx board?",
                 id="garbage"),
    pytest.param(_unplug(Command.RUN), "Serial port '", id="unplugged-before-a-reply"),
    pytest.param(_unplug_after(Command.WRITE), "Serial port '", id="unplugged-after-a-reply"),
])
def test_a_faulty_board_is_caught(board_build, capsys, fault, message):
    folder, result = board_build
    code, _, err, seconds = run_against(folder, result, capsys, fault)
    assert_refused(code, err, seconds, folder, message)


@pytest.mark.parametrize("cycles", [0, 1234, 0xFFFFFFFF])
def test_a_board_that_did_not_run_the_program_is_caught_by_its_cycle_count(
        board_build, capsys, cycles):
    folder, result = board_build
    predicted = host.cycle_window(result.program)[0]
    code, _, err, seconds = run_against(folder, result, capsys, _run_reply(cycles))
    assert_refused(code, err, seconds, folder,
                   f"The board counted {cycles:,} cycles for sample 0, but this program "
                   f"takes {predicted:,}: the board did not run this program; program it "
                   f"with this build and reset it")


def test_a_board_of_another_build_is_refused(board_build, capsys):
    folder, result = board_build
    code, _, err, seconds = run_against(folder, result, capsys, ident=0x1234)
    assert_refused(code, err, seconds, folder, "Device build id must be 0x")


def test_a_slow_board_is_stopped(board_build, capsys):
    """An honest board that sends a byte every 0.5 s: each read waits for its bytes as long
    as they take at the baud rate, twice over, plus the run and a second."""
    folder, result = board_build
    code, _, err, seconds = run_against(folder, result, capsys, byte_time=0.5)
    assert_refused(code, err, seconds, folder, "timed out after 1.00 s: expected 6 bytes, "
                                               "received ")


def test_an_endless_stream_meets_the_runs_deadline(board_build, capsys):
    """A board that answers READ with the longest reply, a byte every 10 ms (11 minutes), is
    stopped at the deadline reckoned from the bytes at the build's baud rate and the
    cycles."""
    folder, result = board_build
    long_reply = _on(Command.READ, lambda reply: protocol.encode_reply(
        0, Command.READ, reply[3], bytes(protocol.MAX_PAYLOAD)))
    code, _, err, seconds = run_against(folder, result, capsys, long_reply, byte_time=0.01)
    assert_refused(code, err, seconds, folder, "did not finish in ")
    assert "the most this run may take (" in err and " baud and 3 run(s) of at most " in err
    budget = float(err.split("did not finish in ")[1].split(" s,")[0])    # to 0.1 s
    assert budget - 0.05 <= seconds < budget + 10     # the command's start-up comes first


@pytest.mark.parametrize("baud", ["0", "-9600"])
def test_a_baud_rate_must_be_positive(board_build, capsys, baud):
    folder, result = board_build
    code, _, err, seconds = run_against(folder, result, capsys, extra=("--baud", baud))
    assert_refused(code, err, seconds, folder,
                   f"The baud rate must be a positive whole number, not {baud}")


def test_a_run_budget_covers_the_bytes_and_the_cycles(board_build):
    """By hand for one sample of one 8-byte input and one output of two 8-byte words on a
    25 MHz board at 115,200 baud: INFO 13 + 21 bytes, WRITE 8 + 21, RUN 4 + 21, READ 16 + 21:
    125 bytes, 1,000 cycles (40 us), four commands."""
    _, result = board_build
    config = result.program.config
    assert (config.rows, config.clock_hz) == (8, 25_000_000)
    seconds, why = host.run_budget(config, 0, 0, [[bytes(8)]], [("act", 0, 2)], 1000, 115_200)
    wire = 13 + 8 + 4 + 16 + 4 * 21
    assert why == (f"{wire} bytes at 115,200 baud and 1 run(s) of at most 1,000 cycles at 25 "
                   f"MHz, twice over, plus 50 ms for each of 4 commands and 5 s")
    assert seconds == pytest.approx(2 * (wire * 10 / 115_200 + 1000 / 25e6) + 0.2 + 5)
