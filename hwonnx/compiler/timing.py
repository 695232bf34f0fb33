"""The cycle model: predicts, for every instruction, when the accelerator dispatches, starts
and finishes it. It mirrors the rules of ``hdl/top.py`` (dispatcher), ``hdl/fetch.py``,
``hdl/feeder.py``, ``hdl/loader.py``, ``hdl/post.py``, ``hdl/eltwise.py`` and ``hdl/dma.py``
(with a paged program, the page rule of ``hdl/top.py``)
with the external memory model of ``hdl/extmem.py`` exactly, so the
prediction equals the simulated cycle count (tested in ``tests/test_rtl.py``,
``tests/test_examples_rtl.py`` and ``tests/test_eltwise_rtl.py``)."""

from dataclasses import dataclass

from ..config import ArchConfig
from ..hdl.eltwise import eltwise_cycles
from ..hdl.extmem import MemoryTimeline
from ..hdl.feeder import bank_release, drain_cycles
from ..hdl.fetch import FETCH_LATENCY
from ..hdl.loader import load_cycles
from ..hdl.post import post_latency
from ..isa import Op, ext_words_per_instruction
from ..memories import ExtTiming

__all__ = ["Timing", "predict"]


@dataclass(frozen=True)
class Timing:
    dispatch: "list[int]"     # cycle each instruction leaves the dispatcher
    done: "list[int]"         # cycle by which its effect is complete
    total: int                # cycles from start to done (the ``cycles`` counter)
    stops: "list[int]"        # the total of the program stopping after each of ``stops``


def predict(instructions: "list[dict]", config: ArchConfig,
            stops: "list[int]" = (), memory_timing: "ExtTiming | None" = None) -> Timing:
    """Timing of ``instructions`` as the dispatcher issues them (``Program.expanded()``).
    ``Timing.stops`` has, for each index ``k`` of ``stops`` (increasing; -1: before the first
    instruction), the total of the program of ``instructions[:k + 1]`` and END, from the same
    pass: a program's prefix runs as it does in the whole program. ``memory_timing`` replaces
    the external memory's timing (``config.ext_timing``): what the same program would take
    with another memory behind the DMA engine."""
    dispatch, done = [], []
    previous = 0
    loader_free = 0               # first cycle the loader accepts a LOADW
    bank_free = [0, 0]            # first cycle a LOADW may overwrite each bank
    pending_free = 0              # first cycle the feeder's pending slot is empty
    feed_end = 0                  # last issue cycle of the latest MATMUL
    drained = 0                   # first cycle no MATMUL or partial sum is in flight
    post_idle = 0                 # first cycle the post-processor is idle
    eltw_idle = 0                 # first cycle the element-wise engine is idle
    dma_idle = 0                  # first cycle the DMA engine is idle (nothing running
    slot_free = 0                 # or waiting); first cycle its slot is empty
    memory = (MemoryTimeline(memory_timing or config.ext_timing, config.cols)
              if config.ext_memory else None)
    total = 0
    latency = post_latency(config)
    loader, release, drain = load_cycles(config), bank_release(config), drain_cycles(config)
    words = config.fetch_words if config.runtime_program else 0
    request = 1                   # narrow fetch: first cycle the next instruction is requested
    page = config.prog_page       # paged: a page's first instruction waits for the DMA
    page_free = 0                 # first cycle the DMA was idle in that cycle and the one before
    stored = 0                    # index of the next stored instruction
    stopped, pending = [], list(reversed(stops))

    def fetched() -> int:         # the first cycle the next stored instruction can leave
        if words:                 # its last word arrives at request + words; the instruction
            return request + words + 1          # register is full one cycle later
        if stored == 0 and not page:            # read at start (cycle 0), then captured
            return FETCH_LATENCY
        if page and stored % page == 0:         # read once the page is written (and after
            return max(request + 1, page_free) + FETCH_LATENCY  # the one before left)
        return 0

    def stop():                   # END's dispatch rule, were END the next instruction
        t = max(previous + 1, fetched())
        return max(t, loader_free, drained, post_idle, eltw_idle, dma_idle)

    if page:                      # the LOADP of the first two pages, in cycle 1 (hdl/top.py)
        previous = 1
        boot = memory.read(2, config.prog_depth * ext_words_per_instruction(config.cols))
        dma_idle, page_free = boot + 1, boot + 2
    while pending and pending[-1] < 0:
        stopped.append(stop())
        pending.pop()
    for index, instr in enumerate(instructions):
        op = instr["op"]
        t = previous + 1
        looped = getattr(instr, "looped", False)    # issued by the walker, not fetched
        if not looped:
            t = max(t, fetched())
        if op in Op.WALKER:       # taken by the walker in the cycle it is presented
            finish = t
        elif op == Op.LOADW:
            t = max(t, loader_free, bank_free[instr["bank"]])
            loader_free = finish = t + loader
        elif op == Op.MATMUL:
            t = max(t, pending_free)
            start = max(t + 1, feed_end, post_idle if instr.get("wait") else 0)
            pending_free = start + 1
            feed_end = start + instr["count"]
            bank_free[instr["bank"]] = feed_end + release
            drained = feed_end + drain
            finish = drained - 1
        elif op == Op.ELTW:
            t = max(t, eltw_idle, drained, post_idle if instr.get("wait") else 0)
            eltw_idle = t + eltwise_cycles(instr["count"])
            finish = eltw_idle - 1
        elif op == Op.POST:       # accepted once the previous POST is done; starts once
            t = max(t, post_idle, eltw_idle)        # the MATMULs before it are drained
            start = max(t, drained)
            post_idle = start + 1 + latency + instr["count"] * instr["nw"]
            finish = post_idle - 1
        elif op in (Op.LOADX, Op.LOADP):    # LOADX waits for the DMA and the loader: a
            if memory is None:                # fence for LOADWs; LOADP for the DMA only
                raise ValueError(f"{Op.NAMES[op]}, but the {config.name} architecture has no "
                                 f"external memory")
            params = instr.get("par_count", 0)      # and with parameters, for the POSTs
            t = max(t, dma_idle, loader_free if op == Op.LOADX else 0,
                    post_idle if params else 0)
            finish = memory.read(t + 1, instr["count"])
            if params:            # read as if dispatched when the engine is free again
                finish = memory.read(finish + 2, params)
            dma_idle = finish + 1
        elif op in Op.ACTX:       # once the engines before it are done with its staging
            if not config.stage_in_depth:    # buffer and the DMA engine (fence) or its slot free
                raise ValueError(f"{Op.NAMES[op]}, but the {config.name} architecture has no "
                                 f"staging buffers")
            t = max(t, (max(drained, eltw_idle) if op == Op.LOADA else post_idle),
                    dma_idle if instr.get("fence") else slot_free)
            begin = max(t, dma_idle)            # waits in the slot until the engine is free
            if begin > t:
                slot_free = begin + 1
            finish = (memory.read(begin + 1, instr["count"]) if op == Op.LOADA
                      else memory.write(begin + 2, instr["count"]))
            dma_idle = finish + 1
        elif op == Op.END:
            t = max(t, loader_free, drained, post_idle, eltw_idle, dma_idle)
            total = t
            finish = t
        else:
            raise ValueError(f"Unknown opcode {op}")
        dispatch.append(t)
        done.append(finish)
        previous = t
        if op in Op.DMA and instr["count"]:   # (a transfer of nothing leaves it idle)
            page_free = finish + 2
        if not looped:
            request = t           # the next fetch starts as this instruction leaves
            stored += 1
        while pending and pending[-1] == index:
            stopped.append(stop())
            pending.pop()
    return Timing(dispatch, done, total, stopped)
