"""The host side of a board's UART link: a pyserial transport for
:class:`hwonnx.boards.protocol.Client`.

pyserial is imported only when a port is opened, so the rest of hwonnx works without it.
"""

import time

import numpy as np

from ..errors import ToolchainError, UsageError
from .protocol import ProtocolError, external_sums

__all__ = ["SerialTransport", "host_io", "run_samples", "send_external", "send_program",
           "unpack_outputs", "wait_for_memory"]


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
        Seconds ``read`` waits for the bytes it was asked for; must also cover the
        accelerator's run time, since ``RUN`` replies only when the run is done.

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
        self.port, self.timeout = port, timeout
        self._error_type = serial.SerialException
        try:
            self._serial = serial.serial_for_url(port, baudrate=baudrate, timeout=timeout,
                                                 write_timeout=timeout)
        except (serial.SerialException, ValueError) as error:
            raise UsageError(f"Cannot open serial port '{port}': {error}") from error
        self._serial.reset_input_buffer()

    def write(self, data: bytes) -> None:
        try:
            self._serial.write(bytes(data))
            self._serial.flush()
        except self._error_type as error:
            raise ProtocolError(f"Serial port '{self.port}' failed: {error}") from error

    def read(self, n: int) -> bytes:
        """Return exactly ``n`` bytes, or raise :class:`ProtocolError` after ``timeout``."""
        try:
            data = self._serial.read(n)
        except self._error_type as error:
            raise ProtocolError(f"Serial port '{self.port}' failed: {error}") from error
        if len(data) != n:
            raise ProtocolError(f"Serial port '{self.port}' timed out after {self.timeout} s: "
                                f"expected {n} bytes, received {len(data)}")
        return bytes(data)

    def close(self) -> None:
        self._serial.close()

    def __enter__(self) -> "SerialTransport":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


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


def run_samples(client, config, in_places: "list[tuple[str, int]]",
                reads: "list[tuple[str, int, int]]", samples: "list[list[bytes]]"
                ) -> "tuple[list[list[bytes]], list[int]]":
    """For each sample (the words of each input): write each input's words at its place of
    ``in_places`` (``(memory, address)``: ``act`` the activation buffer, ``ext`` the external
    memory), run, read each output's ``(memory, address, words)`` of ``reads``. Returns the
    raw bytes of each output per sample and the cycles the board counted per sample. Used by
    ``hwonnx run`` over a serial port and by the full-system simulation.

    A tensor in the external memory (``hwonnx.compiler.spill``) goes over WRITEX and READX;
    its words are as wide as the activation buffer's there (only square arrays put tensors
    in the external memory)."""
    width = config.cols * 8
    if any(memory == "ext" for memory, *_ in (*in_places, *reads)) \
            and config.rows != config.cols:
        raise ValueError(f"A {config.name} array keeps no tensor in the external memory")
    outputs, cycles = [], []
    for sample in samples:
        for (memory, addr), data in zip(in_places, sample, strict=True):
            if memory == "ext":
                client.write_external([int.from_bytes(data[i:i + config.cols], "little")
                                       for i in range(0, len(data), config.cols)], width, addr)
            else:
                client.write_words(addr, data)
        cycles.append(client.run())
        outputs.append([client.read_external(addr, words, width) if memory == "ext"
                        else client.read_words(addr, words) for memory, addr, words in reads])
    return outputs, cycles


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
