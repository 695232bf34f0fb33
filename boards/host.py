"""The host side of a board's UART link: a pyserial transport for
:class:`hwonnx.boards.protocol.Client`.

pyserial is imported only when a port is opened, so the rest of hwonnx works without it.
"""

import time

import numpy as np

from ..errors import ToolchainError, UsageError
from .protocol import (
    BITS_PER_BYTE, CRC_BYTES, FRAME_HEAD, MAX_PAYLOAD, REPLY_HEAD, ProtocolError, external_sums,
)

__all__ = ["SerialTransport", "SLOWER_MEMORY", "cycle_window", "host_io", "run_budget",
           "run_samples", "send_external", "send_program", "unpack_outputs", "wait_for_memory"]


class SerialTransport:
    """A serial port (8N1) as a :class:`~hwonnx.boards.protocol.Client` transport.

    Parameters
    ----------
    port : str
        Device (``/dev/ttyUSB1``, ``COM4``) or pyserial URL (``loop://``,
        ``socket://host:port``).
    baudrate : int
        Must match the divisor the bitstream was built with (``clock_hz // divisor``).
    timeout : float
        Seconds ``read`` waits for the bytes it was asked for, beyond twice their time on the
        wire at ``baudrate``; must also cover the accelerator's run time, since ``RUN``
        replies only when the run is done.

    Raises
    ------
    ToolchainError
        If pyserial is not installed.
    UsageError
        If the port cannot be opened.
    ProtocolError
        From ``read`` and ``write``, if the port fails or ``read`` times out.
    """

    def __init__(self, port: str, baudrate: int = 115200, timeout: float = 2.0):
        try:
            import serial
        except ImportError as error:
            raise ToolchainError("Talking to a board needs pyserial; install it with "
                                 "'pip install pyserial'") from error
        self.port, self.timeout, self.baudrate = port, timeout, baudrate
        # A port that goes away (a board unplugged) fails in pyserial, in the OS or, from
        # tcdrain, in termios.
        self._errors = (serial.SerialException, OSError) + _termios_error()
        self._deadline: "tuple[float, float, str] | None" = None
        try:
            self._serial = serial.serial_for_url(port, baudrate=baudrate, timeout=timeout,
                                                 write_timeout=timeout)
            self._serial.reset_input_buffer()
        except (ValueError,) + self._errors as error:
            raise UsageError(f"Cannot open serial port '{port}': {error}") from error

    def set_deadline(self, seconds: float, why: str) -> None:
        """From now on, fail every ``read`` or ``write`` once ``seconds`` have passed: the
        whole run's budget (``why`` says how it was reckoned, for the error)."""
        self._deadline = (time.monotonic() + seconds, seconds, why)

    def _remaining(self, n: int = 0) -> float:
        """Seconds to move ``n`` bytes: ``timeout`` plus twice their time on the wire, or
        what is left to the deadline."""
        wait = self.timeout + 2 * n * BITS_PER_BYTE / self.baudrate
        if self._deadline is None:
            return wait
        end, seconds, why = self._deadline
        left = end - time.monotonic()
        if left <= 0:
            raise ProtocolError(f"The board on '{self.port}' did not finish in {seconds:.1f} s, "
                                f"the most this run may take ({why})")
        return min(wait, left)

    def write(self, data: bytes) -> None:
        try:
            self._serial.write_timeout = self._remaining(len(data))
            self._serial.write(bytes(data))
            self._serial.flush()
        except self._errors as error:
            raise ProtocolError(f"Serial port '{self.port}' failed: {_text(error)}") from error

    def read(self, n: int) -> bytes:
        """Return exactly ``n`` bytes, or raise :class:`ProtocolError` after ``timeout`` (or
        at the deadline, if that comes first)."""
        data, limit = b"", self._remaining(n)
        end = time.monotonic() + limit
        while len(data) < n:
            left = end - time.monotonic()
            if left <= 0:
                self._remaining()       # the deadline's error, if that is what passed
                raise ProtocolError(f"Serial port '{self.port}' timed out after {limit:.2f} s: "
                                    f"expected {n} bytes, received {len(data)}")
            try:
                self._serial.timeout = left
                data += self._serial.read(n - len(data))
            except self._errors as error:
                raise ProtocolError(f"Serial port '{self.port}' failed: {_text(error)}") \
                    from error
        return bytes(data)

    def close(self) -> None:
        try:
            self._serial.close()
        except self._errors:            # a port that went away: nothing left to close
            pass

    def __enter__(self) -> "SerialTransport":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _termios_error() -> tuple:
    try:
        import termios
    except ImportError:                 # not on Windows
        return ()
    return (termios.error,)


def _text(error: Exception) -> str:
    """One line for an OS or port error (termios.error is a bare tuple of errno and text)."""
    if not isinstance(error, OSError) and len(error.args) == 2 \
            and isinstance(error.args[0], int):
        return f"{error.args[1]} (errno {error.args[0]})"
    return " ".join(str(error).split()) or type(error).__name__


def send_program(client, config, program_words: "list[int]") -> None:
    """Load the program over the host link when ``config`` keeps it in a memory without
    initial contents (``ArchConfig.runtime_program``); otherwise it is in the bitstream."""
    if config.runtime_program:
        client.load_program(program_words, config.prog_width)


#: Words one SUMX sums (its count is 16 bits).
_SUM_WORDS = 65535


def send_external(client, config, words: "list[int]", wait: float = 1.0, log=None) -> bool:
    """Load the external memory's image (the program's pages and the streamed weights) over
    the host link when ``config`` has an external memory, and check that the board holds it.

    First wait (up to ``wait`` seconds) until the board reports the memory up
    (:func:`wait_for_memory`). The board sums the image's words (SUMX, a stretch at a time):
    where they already sum as the image does (the board was loaded before and kept its
    power), nothing is sent; otherwise those words are written (WRITEX) and summed again.
    Returns whether anything was written.

    Raises
    ------
    ProtocolError
        If the memory does not come up, or holds other words than were written."""
    if not config.ext_memory:
        return False
    wait_for_memory(client, config, wait)
    width, wrote = config.cols * 8, False
    for first in range(0, len(words), _SUM_WORDS):
        chunk = words[first:first + _SUM_WORDS]
        want = external_sums(chunk, width)
        if client.sum_external(first, len(chunk)) == want:
            continue
        if log is not None:
            log(f"Loading words {first:,} to {first + len(chunk):,} of {len(words):,} into the "
                f"board's external memory '{config.ext_memory}' ...")
        client.write_external(chunk, width, first)
        wrote = True
        if client.sum_external(first, len(chunk)) != want:
            raise ProtocolError(f"The board's external memory '{config.ext_memory}' holds "
                                f"other words than were written to words [{first}, "
                                f"{first + len(chunk)}): it does not keep what it is given")
    return wrote


def wait_for_memory(client, config, wait: float = 1.0) -> None:
    """Poll STATUS until the board's external memory is up: its controller initialized and
    its reads leveled, which takes a few milliseconds after configuration.

    Raises
    ------
    ProtocolError
        If the board reports that the memory failed to come up, or not up after ``wait``
        seconds."""
    deadline = time.monotonic() + wait
    while True:
        status = client.status()
        if status.memory_failed:
            raise ProtocolError(f"The board's external memory '{config.ext_memory}' failed to "
                                f"come up: its read leveling found no working delay for a "
                                f"byte lane (check the memory and its clock)")
        if status.memory_ready:
            return
        if time.monotonic() > deadline:
            raise ProtocolError(f"The board's external memory '{config.ext_memory}' is not up "
                                f"after {wait} s (STATUS reports it neither ready nor failed)")
        time.sleep(0.01)


#: How many times slower than its estimate a board's external memory may be before its cycle
#: count is no longer believed (``cycle_window``).
SLOWER_MEMORY = 4


def cycle_window(program) -> "tuple[int, int]":
    """The fewest and the most cycles a board may count for a run of ``program``: the
    prediction exactly where every memory is on chip; with an external memory, whose timing
    on the board is an estimate, from the program's cycles with the fastest memory the DMA
    engine can take to its cycles with one :data:`SLOWER_MEMORY` times slower than the
    estimate."""
    from ..compiler.timing import predict
    cfg, instructions = program.config, program.expanded()
    if not cfg.ext_memory:
        total = predict(instructions, cfg).total
        return total, total
    timing = cfg.ext_timing
    return (predict(instructions, cfg, memory_timing=timing.fastest(cfg.cols)).total,
            predict(instructions, cfg, memory_timing=timing.slower(SLOWER_MEMORY)).total)


def run_budget(config, program_words: int, ext_words: int,
               samples: "list[list[bytes]]", reads: "list[tuple[str, int, int]]",
               most_cycles: int, baud: int) -> "tuple[float, str]":
    """The most seconds ``hwonnx run`` lets a whole run take, and how they were reckoned:
    twice the bytes on the wire at ``baud`` (every frame and reply, the program's words on a
    board that loads them, the external image written once and summed twice) and the runs at
    their most cycles, plus 50 ms per command for the USB-serial bridge's latency and 5 s to
    start (the memory's bring-up among them)."""
    frame = FRAME_HEAD + REPLY_HEAD + 2 * CRC_BYTES + 6     # a command with its address
    commands = 0

    def transfer(nbytes: int) -> int:
        nonlocal commands
        frames = 1 + nbytes // (MAX_PAYLOAD - 6)
        commands += frames
        return nbytes + frames * frame

    wire = transfer(13)
    if config.runtime_program:
        wire += transfer(program_words * config.prog_width // 8)
    if config.ext_memory:
        sums = -(-ext_words // _SUM_WORDS)
        wire += transfer(ext_words * config.cols) + 2 * sums * (frame + 8)
        commands += 2 * sums
    width = max(config.rows, config.cols)
    for sample in samples:
        wire += sum(transfer(len(data)) for data in sample) + transfer(4)         # RUN
        wire += sum(transfer(words * width) for _, _, words in reads)
    run = len(samples) * most_cycles / config.clock_hz
    seconds = 2 * (wire * BITS_PER_BYTE / baud + run) + 0.05 * commands + 5
    return seconds, (f"{wire:,} bytes at {baud:,} baud and {len(samples)} run(s) of at most "
                     f"{most_cycles:,} cycles at {config.clock_hz / 1e6:g} MHz, twice over, "
                     f"plus 50 ms for each of {commands:,} commands and 5 s")


def run_samples(client, config, in_places: "list[tuple[str, int]]",
                reads: "list[tuple[str, int, int]]", samples: "list[list[bytes]]",
                cycles: "tuple[int, int]") -> "tuple[list[list[bytes]], list[int]]":
    """For each sample (the words of each input): write each input's words at its place of
    ``in_places`` (``(memory, address)``: ``act`` the activation buffer, ``ext`` the external
    memory), run, check that the board counted ``cycles`` (the fewest and the most,
    :func:`cycle_window`), read each output's ``(memory, address, words)`` of ``reads``.
    Returns the raw bytes of each output per sample and the cycles the board counted per
    sample. Used by ``hwonnx run`` over a serial port and by the full-system simulation.

    A count outside ``cycles`` raises :class:`ProtocolError`: the board did not run this
    program (it answered RUN without computing, or runs another program).

    A tensor in the external memory (``hwonnx.compiler.spill``) goes over WRITEX and READX;
    its words are as wide as the activation buffer's there (only square arrays put tensors
    in the external memory)."""
    width = config.cols * 8
    if any(memory == "ext" for memory, *_ in (*in_places, *reads)) \
            and config.rows != config.cols:
        raise ValueError(f"A {config.name} array keeps no tensor in the external memory")
    outputs, counted = [], []
    least, most = cycles
    for index, sample in enumerate(samples):
        for (memory, addr), data in zip(in_places, sample, strict=True):
            if memory == "ext":
                client.write_external([int.from_bytes(data[i:i + config.cols], "little")
                                       for i in range(0, len(data), config.cols)], width, addr)
            else:
                client.write_words(addr, data)
        counted.append(client.run())
        if not least <= counted[-1] <= most:
            takes = (f"{least:,}" if least == most else
                     f"{least:,} to {most:,} (with its external memory's timing)")
            raise ProtocolError(f"The board counted {counted[-1]:,} cycles for sample {index}, "
                                f"but this program takes {takes}: the board did not run this "
                                f"program; program it with this build and reset it")
        outputs.append([client.read_external(addr, words, width) if memory == "ext"
                        else client.read_words(addr, words) for memory, addr, words in reads])
    return outputs, counted


def host_io(program, inputs) -> "tuple[list, list, list[list[bytes]]]":
    """What the host sends and asks for to run ``program`` on the int8 ``inputs`` (input value
    -> ``[S, *shape]``): each input's ``(memory, address)``, each output's ``(memory, address,
    words)`` and, per sample, each input's words as bytes (the arguments of
    :func:`run_samples`; ``hwonnx run`` and the full-system simulation)."""
    from ..compiler.layout import pack_words
    rows = program.config.rows
    sources = [program.placements[port.value] for port in program.inputs]
    targets = [program.placements[port.value] for port in program.outputs]
    arrays = [inputs[port.value] for port in program.inputs]
    samples = [[b"".join(w.to_bytes(rows, "little") for w in pack_words(array[i], source, rows))
                for array, source in zip(arrays, sources)] for i in range(len(arrays[0]))]
    return ([(p.memory, p.base) for p in sources], [(p.memory, p.base, p.words) for p in targets],
            samples)


def unpack_outputs(program, raw: "list[list[bytes]]") -> "dict[str, np.ndarray]":
    """The int8 outputs (output value -> ``[S, *shape]``) of the bytes :func:`run_samples`
    read per sample and output."""
    from ..compiler.layout import unpack_words
    rows = program.config.rows
    return {port.value: np.stack([unpack_words(
        [int.from_bytes(sample[k][i:i + rows], "little") for i in range(0, len(sample[k]), rows)],
        program.placements[port.value], rows) for sample in raw])
        for k, port in enumerate(program.outputs)}
