"""BankedMemory: the weight buffer in banks one block RAM deep, its read address and each
bank's read data registered; the word at the address presented in cycle k is on ``read.data``
in k + 3 as it was after cycle k's write (k + 1 in one memory, as it was before that cycle's
write), writes land in the bank their address names."""

import numpy as np
import pytest
from amaranth.hdl import unsigned

from hwonnx.hdl.banks import BankedMemory, banking

from hdl_helpers import run_cycles


NARROW, WIDE = banking(20)[0], banking(80)[0]     # 512 and 2048 words a bank


@pytest.mark.parametrize("width, depth, banked", [
    (20, 2 * NARROW + 37, True), (20, NARROW, True), (20, 100, True), (20, 300, False),
    (20, NARROW, False), (80, 2 * WIDE + 37, True), (80, WIDE + 1, True)])
def test_reads_see_the_image_and_every_write_at_their_latency(width, depth, banked):
    """Random reads and writes over every bank (and the partial last one), with reads of a
    word presented in the cycle of its write and the one after; the expected words come
    from a list kept by the test. Narrow words in 512-word banks (two to a copy of the read
    address), wide ones in 2048-word banks (each with its own)."""
    rng = np.random.default_rng(depth)

    def value():
        return int.from_bytes(rng.bytes(-(-width // 8)), "little") & ((1 << width) - 1)
    image = [value() for _ in range(depth)]
    dut = BankedMemory(unsigned(width), depth, image, banked=banked)
    latency, registered = (3, 1) if banked else (1, 0)    # registered: the address's stages
    assert dut.read_latency == latency
    model = list(image)
    ops = []
    for k in range(400):
        address = int(rng.integers(0, depth))
        write = (int(rng.integers(0, depth)), value()) \
            if rng.random() < 0.4 else None
        if write and k % 5 == 0:
            address = write[0]          # a read presented in the cycle of the word's write
        ops.append((address, write))
    expected, seen = {}, {}

    def step(ctx, cycle):
        # The block RAM reads the address presented ``registered`` cycles before, before
        # this cycle's write.
        if registered <= cycle < len(ops) + registered:
            expected[cycle - registered + latency] = model[ops[cycle - registered][0]]
        if cycle < len(ops):
            address, write = ops[cycle]
            ctx.set(dut.read.addr, address)
            ctx.set(dut.write.en, write is not None)
            if write:
                ctx.set(dut.write.addr, write[0])
                ctx.set(dut.write.data, write[1])
                model[write[0]] = write[1]
        else:
            ctx.set(dut.write.en, 0)
        seen[cycle] = ctx.get(dut.read.data)

    run_cycles(dut, len(ops) + latency + 1, step)
    assert {k: seen[k] for k in expected} == expected
