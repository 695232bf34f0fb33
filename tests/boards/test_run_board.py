"""``hwonnx run`` against a board stand-in that speaks the UART protocol (the protocol itself
is proven against the RTL in tests/boards/test_system_rtl.py): identity check, transfers, and
outputs decoded exactly as the golden model computes them."""

import struct

import numpy as np
import pytest

from hwonnx.api import build, simulate
from hwonnx.boards import host, protocol
from hwonnx.boards.build import build_id
from hwonnx.cli import main
from hwonnx.compiler.layout import pack_words, unpack_words
from hwonnx.compiler.program import encode_program
from hwonnx.examples import example_path, load_digits_data
from hwonnx.golden import evaluate


class FakeBoard:
    """A transport whose far end is a board running the build: activation memory, and RUN
    evaluates the integer graph with the golden model on the words of every input, writes
    every output's words and counts the predicted cycles (``cycles``, if given, instead)."""

    def __init__(self, result, ident, cycles: "int | None" = None):
        self.result, self.ident = result, ident
        self.cycles = cycles if cycles is not None else host.cycle_window(result.program)[0]
        self.memory, self.pending = {}, b""
        self.program: "dict[int, int]" = {}         # words written by LOAD
        self.deadline = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_deadline(self, seconds, why):
        self.deadline = seconds, why

    def write(self, data):
        cmd, seq, payload = protocol.decode_frame(data)
        program, cfg = self.result.program, self.result.program.config
        reply = b""
        if cmd == protocol.Command.INFO:
            reply = protocol.DeviceInfo(protocol.PROTOCOL_VERSION, cfg.rows, cfg.cols,
                                        cfg.act_depth, self.ident).encode()
        elif cmd == protocol.Command.WRITE:
            addr = struct.unpack("<H", payload[:2])[0]
            for i in range(0, len(payload) - 2, cfg.rows):
                self.memory[addr + i // cfg.rows] = int.from_bytes(payload[2 + i:2 + i + cfg.rows],
                                                                   "little")
        elif cmd == protocol.Command.LOAD and cfg.runtime_program:
            addr, size = struct.unpack("<H", payload[:2])[0], cfg.prog_width // 8
            for i in range(0, len(payload) - 2, size):
                self.program[addr + i // size] = int.from_bytes(payload[2 + i:2 + i + size],
                                                                "little")
        elif cmd == protocol.Command.RUN:
            if cfg.runtime_program:         # a board without its program does nothing useful
                words = encode_program(program)
                assert [self.program.get(i) for i in range(len(words))] == words
            feeds = {}
            for port in program.inputs:         # every input, from where the host wrote it
                source = program.placements[port.value]
                feeds[port.value] = unpack_words(
                    [self.memory[source.base + i] for i in range(source.words)], source, cfg.rows)
            env = evaluate(self.result.graph, feeds, keep_all=True)
            for port in program.outputs:        # every output, where the host reads it
                target = program.placements[port.value]
                for i, word in enumerate(pack_words(env[port.value], target, cfg.rows)):
                    self.memory[target.base + i] = word
            reply = struct.pack("<I", self.cycles)
        elif cmd == protocol.Command.READ:
            addr, count = struct.unpack("<HH", payload)
            reply = b"".join(self.memory[addr + i].to_bytes(cfg.rows, "little")
                             for i in range(count))
        self.pending += protocol.encode_reply(0, cmd, seq, reply)

    def read(self, n):
        data, self.pending = self.pending[:n], self.pending[n:]
        return data


@pytest.fixture(scope="module", params=["ulx3s-85f", "icebreaker"])
def board_build(tmp_path_factory, request):
    """The ULX3S has its program in the bitstream; the iCEBreaker gets it over the UART
    (LOAD) from ``hwonnx run`` before the first sample."""
    folder = tmp_path_factory.mktemp(request.param)
    data = load_digits_data()
    result = build(example_path("digits_mlp"), folder, board=request.param,
                   calib={"image": data["calib"]}, verilog=False, log=lambda message: None)
    np.save(folder / "x.npy", data["test_images"][:4])
    return folder, result


def test_run_on_board_equals_golden(board_build, monkeypatch, capsys):
    folder, result = board_build
    monkeypatch.setattr(host, "SerialTransport",
                        lambda port, baud, timeout: FakeBoard(result, build_id(result.program)))
    code = main(["run", str(folder), "--port", "/dev/ttyFAKE", "--input", str(folder / "x.npy"),
                 "--output", str(folder / "y.npz")])
    assert code == 0
    golden = simulate(folder, folder / "x.npy", mode="golden")
    cycles = golden.predicted_cycles
    assert f"4 sample(s) on the board: {cycles:,} cycles per sample (predicted {cycles:,})" \
        in capsys.readouterr().out
    with np.load(folder / "y.npz") as npz:
        np.testing.assert_array_equal(npz["logits"], golden.outputs["logits"])


def test_run_refuses_a_board_with_another_build(board_build, monkeypatch, capsys):
    folder, result = board_build
    monkeypatch.setattr(host, "SerialTransport",
                        lambda port, baud, timeout: FakeBoard(result, 0x1234))
    code = main(["run", str(folder), "--port", "/dev/ttyFAKE", "--input", str(folder / "x.npy")])
    assert code == 2
    assert capsys.readouterr().err == (
        f"hwonnx: error: Device build id must be 0x{build_id(result.program):08X}, not "
        f"0x00001234; program the board with this build\n")
