"""The cycle model: predicts, for every instruction, when the accelerator dispatches, starts
and finishes it. It mirrors the rules of ``hdl/top.py`` (dispatcher), ``hdl/fetch.py``,
``hdl/feeder.py``, ``hdl/loader.py``, ``hdl/post.py``, ``hdl/eltwise.py`` and ``hdl/dma.py``
(with a paged program, the page rule of ``hdl/top.py``)
with the external memory model of ``hdl/extmem.py`` exactly, so the
prediction equals the simulated cycle count (tested in ``tests/end_to_end/test_rtl.py``,
``tests/end_to_end/test_examples_rtl.py`` and ``tests/operators/test_eltwise_rtl.py``)."""

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..config import ArchConfig
from ..hdl.dispatch import handoff_latency
from ..hdl.eltwise import eltwise_cycles
from ..hdl.extmem import MemoryTimeline
from ..hdl.feeder import bank_release, drain_cycles
from ..hdl.fetch import fetch_latency
from ..hdl.loader import load_cycles
from ..hdl.post import post_latency
from ..isa import Op, ext_words_per_instruction
from ..memories import ExtTiming
from .nest_rows import COLUMN, expand_rows

if TYPE_CHECKING:
    from .program import Program

__all__ = ["Timing", "predict", "program_timing", "last_write", "layer_cycles", "cycle_windows",
           "cycle_breakdown", "CYCLE_CATEGORIES"]


def last_write(instr, config: ArchConfig, words: "int | None" = None) -> "int | None":
    """The accumulator word a MATMUL's last word writes (``hdl/feeder.py``), or None when
    that word writes none (depthwise streaming keeps only word ``j`` of each row of ``ow``
    with ``j mod vstride = 0`` and ``j <= vlast``; its rows start at ``ox0`` 0). ``words``:
    ``1 << config.acc_addr_bits``, given (:func:`predict`, per instruction) or not."""
    words = (1 << config.acc_addr_bits) if words is None else words
    if not instr.get("dw"):
        return (instr.get("acc_addr", 0) + instr["count"] - 1) % words  # (left out: 0)
    return _last_word(instr.get("acc_addr", 0), instr["count"], instr["ow"], instr["vstride"],
                      instr["vlast"], words)


def _last_word(acc_addr: int, count: int, ow: int, vstride: int, vlast: int, words: int
               ) -> "int | None":
    """:func:`last_write` of a depthwise-streaming MATMUL, from its fields."""
    rows, j = divmod(count - 1, ow)                 # the last word: row ``rows``, index j
    if j % vstride or j > vlast:
        return None
    per_row = min(ow - 1, vlast) // vstride + 1     # words kept in a whole row
    before = rows * per_row + j // vstride          # kept words before the last one
    return (acc_addr + before) % words


#: The categories :func:`cycle_breakdown` splits a layer's predicted cycles into.
CYCLE_CATEGORIES = ("compute", "weight_loads", "boundaries", "host")


@dataclass(frozen=True)
class Timing:
    dispatch: "list[int]"     # cycle each instruction leaves the dispatcher
    done: "list[int]"         # cycle by which its effect is complete
    total: int                # cycles from start to done (the ``cycles`` counter)
    stops: "list[int]"        # the total of the program stopping after each of ``stops``
    #: first, end of each MATMUL's feed of the array, in order, flat (:func:`cycle_breakdown`)
    fed: "list[int]" = ()
    #: first, end of the weight loader's (LOADW) or the DMA's (LOADX, LOADA, STOREA) work
    loading: "list[int]" = ()
    #: (dispatch, done) of each stored instruction, a LOOP's done that of the last
    #: micro-instruction the walker issues for it (or its own, if later)
    spans: "list[tuple[int, int]]" = ()


def predict(instructions: "list[dict]", config: ArchConfig,
            stops: "list[int]" = (), memory_timing: "ExtTiming | None" = None) -> Timing:
    """Timing of ``instructions`` as the dispatcher issues them (``Program.expanded()``).
    ``Timing.stops`` has, for each index ``k`` of ``stops`` (increasing; -1: before the first
    instruction), the total of the program of ``instructions[:k + 1]`` and END, from the same
    pass: a program's prefix runs as it does in the whole program. ``memory_timing`` replaces
    the external memory's timing (``config.ext_timing``): what the same program would take
    with another memory behind the DMA engine."""
    return _predict(instructions, config, stops, memory_timing, walk=False)


def _predict(instructions, config: ArchConfig, stops, memory_timing, walk: bool) -> Timing:
    """:func:`predict`; with ``walk``, ``instructions`` are the stored ones (a program's
    ``instructions``, not expanded), and the micro-instructions the walker issues after each
    LOOP are timed from the rows of its nest (:func:`~.nest_rows.expand_rows`: the walk of
    :func:`~.loops.expand` without an instruction object per tile; ResNet-18 with an
    external memory issues 1.79 M)."""
    dispatch, done, fed, loading, spans = [], [], [], [], []
    previous = 0
    loader_free = 0               # first cycle the loader is idle (a fence, END)
    loader_next = 0               # first cycle the dispatcher may hand it a LOADW: with the
                                  # hand-off, the cycle before it is idle (free_next)
    bank_free = [0, 0]            # first cycle a LOADW may overwrite each bank
    pending_free = 0              # first cycle the feeder's pending slot is empty
    feed_end = 0                  # last issue cycle of the latest MATMUL
    written = None                # the accumulator word its last word writes (last_write)
    drained = 0                   # first cycle no MATMUL or partial sum is in flight
    post_idle = 0                 # first cycle the post-processor is idle
    eltw_idle = 0                 # first cycle the element-wise engine is idle
    dma_idle = 0                  # first cycle the DMA engine is idle (nothing running
    slot_free = 0                 # or waiting); first cycle its slot is empty
    memory = (MemoryTimeline(memory_timing or config.ext_timing, config.cols)
              if config.ext_memory else None)
    total = 0
    latency = post_latency(config)
    passes = config.post_passes     # cycles per step of a POST (hdl/post.py)
    handoff = handoff_latency(config)   # an engine takes what is dispatched in t in t + this
    loader, release, drain = load_cycles(config), bank_release(config), drain_cycles(config)
    words = config.fetch_words if config.runtime_program else 0
    fetched_at = fetch_latency(config)    # a program memory of whole instructions
    request = 1                   # narrow fetch: first cycle the next instruction is requested
    page = config.prog_page       # paged: a page's first instruction waits for the DMA
    page_free = 0                 # first cycle the DMA was idle in that cycle and the one before
    stored = 0                    # index of the next stored instruction
    stopped, pending = [], list(reversed(stops))
    acc_words = 1 << config.acc_addr_bits
    templates = {}                # walk: the latest SETMM and SETPOST

    def fetched() -> int:         # the first cycle the next stored instruction can leave
        if words:                 # its last word arrives at request + words; the instruction
            return request + words + 1          # register is full one cycle later
        if stored == 0 and not page:            # read at start (cycle 0), then captured
            return fetched_at
        if page and stored % page == 0:         # read once the page is written (and after
            return max(request + 1, page_free) + fetched_at  # the one before left)
        return 0

    def stop():                   # END's dispatch rule, were END the next instruction
        t = max(previous + 1, fetched())
        return max(t, loader_free, drained, post_idle, eltw_idle, dma_idle)

    # The rules of the three engines the walker also issues to: each takes the cycle ``t``
    # the instruction could leave at the earliest, and returns when it leaves and is done.
    def load_weights(t: int, bank: int) -> "tuple[int, int]":
        nonlocal loader_free, loader_next
        t = max(t, loader_next, bank_free[bank])
        loader_free = t + handoff + loader
        loader_next = loader_free - handoff
        loading.extend((t + handoff, loader_free))
        return t, loader_free

    def feed(t: int, acc_addr: int, count: int, wait, bank: int, last: "int | None"
             ) -> "tuple[int, int]":
        nonlocal pending_free, feed_end, written, drained
        t = max(t, pending_free)
        # not back to back with a MATMUL whose last word writes the word its first
        # word writes: the read of that word would come too early to see the write
        first_word = acc_addr % acc_words
        start = max(t + handoff + 1, feed_end + (first_word == written),
                    post_idle if wait else 0)
        written = last              # (last_write of this MATMUL)
        pending_free = start + 1
        feed_end = start + count
        bank_free[bank] = feed_end + release
        drained = feed_end + drain
        fed.extend((start, feed_end))
        return t, drained - 1

    def post(t: int, count: int, nw: int) -> "tuple[int, int]":
        nonlocal post_idle        # accepted once the previous POST is done; starts once
        t = max(t, post_idle, eltw_idle)        # the MATMULs before it are drained
        start = max(t, drained)
        post_idle = start + handoff + 1 + latency + count * nw * passes
        return t, post_idle - 1

    if page:                      # the LOADP of the first two pages, in cycle 1 (hdl/top.py)
        previous = 1
        boot = memory.read(2 + handoff,
                           config.prog_depth * ext_words_per_instruction(config.cols))
        dma_idle, page_free, slot_free = boot + 1, boot + 2, 2 + handoff
    while pending and pending[-1] < 0:
        stopped.append(stop())
        pending.pop()
    index = -1
    for item in instructions:
        index += 1
        instr = getattr(item, "fields", item)       # (an Instr's fields: read directly)
        op = instr["op"]
        t = previous + 1
        looped = getattr(item, "looped", False)     # issued by the walker, not fetched
        if not looped:
            t = max(t, fetched())
        if op in Op.WALKER:       # taken by the walker in the cycle it is presented
            finish = t
        elif op == Op.LOADW:
            t, finish = load_weights(t, instr["bank"])
        elif op == Op.MATMUL:
            t, finish = feed(t, instr.get("acc_addr", 0), instr["count"], instr.get("wait"),
                             instr["bank"], last_write(instr, config, acc_words))
        elif op == Op.ELTW:
            t = max(t, eltw_idle, drained, post_idle if instr.get("wait") else 0)
            eltw_idle = t + handoff + eltwise_cycles(config, instr["count"])
            finish = eltw_idle - 1
        elif op == Op.POST:
            t, finish = post(t, instr["count"], instr["nw"])
        elif op in (Op.LOADX, Op.LOADP):    # LOADX waits for the DMA and the loader: a
            if memory is None:                # fence for LOADWs; LOADP for the DMA only
                raise ValueError(f"{Op.NAMES[op]}, but the {config.name} architecture has no "
                                 f"external memory")
            params = instr.get("par_count", 0)      # and with parameters, for the POSTs
            t = max(t, dma_idle, loader_free if op == Op.LOADX else 0,
                    post_idle if params else 0)
            finish = memory.read(t + handoff + 1, instr["count"])
            if params:            # read as if dispatched when the engine is free again
                finish = memory.read(finish + 2, params)
            dma_idle, slot_free = finish + 1, max(slot_free, t + handoff + 1)
            if op == Op.LOADX:
                loading.extend((t + handoff + 1, finish + 1))
        elif op in Op.ACTX:       # once the engines before it are done with its staging
            if not config.stage_in_depth:    # buffer and the DMA engine (fence) or its slot free
                raise ValueError(f"{Op.NAMES[op]}, but the {config.name} architecture has no "
                                 f"staging buffers")
            t = max(t, (max(drained, eltw_idle) if op == Op.LOADA else post_idle),
                    dma_idle if instr.get("fence") else slot_free)
            taken = t + handoff                 # by the engine; it waits in the slot until
            begin = max(taken, dma_idle)        # the engine is free
            slot_free = begin + 1 if begin > taken else max(slot_free, taken + 1)
            finish = (memory.read(begin + 1, instr["count"]) if op == Op.LOADA
                      else memory.write(begin + 2, instr["count"]))
            dma_idle = finish + 1
            loading.extend((t + handoff + 1, finish + 1))
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
        if looped:
            spans[-1] = (spans[-1][0], max(spans[-1][1], finish))
        else:
            request = t           # the next fetch starts as this instruction leaves
            stored += 1
            spans.append((t, finish))
        while pending and pending[-1] == index:
            stopped.append(stop())
            pending.pop()
        if not walk or op not in Op.WALKER:
            continue
        if op != Op.LOOP:
            templates[op] = instr
            continue
        # The walker's micro-instructions for this LOOP (looped: never fetched, no DMA)
        setmm, setpost = templates[Op.SETMM], templates[Op.SETPOST]
        rows = expand_rows(setmm, setpost, instr, config)
        depthwise = setmm.get("dw")
        ow, vstride, vlast = (setmm.get(k, 0) for k in ("ow", "vstride", "vlast"))
        last_done = finish
        for op, bank, count, acc_addr, wait, nw in rows[:, _TIMED].tolist():
            t = previous + 1
            if op == Op.LOADW:
                t, finish = load_weights(t, bank)
            elif op == Op.MATMUL:
                last = (_last_word(acc_addr, count, ow, vstride, vlast, acc_words)
                        if depthwise else (acc_addr + count - 1) % acc_words)
                t, finish = feed(t, acc_addr, count, wait, bank, last)
            else:
                t, finish = post(t, count, nw)
            dispatch.append(t)
            done.append(finish)
            previous = t
            last_done = max(last_done, finish)
        if len(rows) != walk_length(instr):     # (the stops were counted with it)
            raise AssertionError(f"LOOP {index}: {len(rows)} micro-instructions, not "
                                 f"{walk_length(instr)}")
        index += len(rows)
        spans[-1] = (spans[-1][0], last_done)
        while pending and pending[-1] <= index:     # (a stop within a walk: at its end)
            stopped.append(stop())
            pending.pop()
    return Timing(dispatch, done, total, stopped, fed, loading, spans)


#: The columns of a walk's rows that :func:`_predict` reads.
_TIMED = [COLUMN[name] for name in ("op", "bank", "count", "acc_addr", "wait", "nw")]


# Each layer's share of the predicted timeline ------------------------------------------------

def program_timing(program: "Program") -> Timing:
    """``predict(program.expanded(), program.config)``, computed once per program
    (:meth:`~.program.Program.cached`): the report and the build folder read it. Its
    ``stops`` are those after each layer (:func:`layer_cycles`), from the same pass."""
    return program.cached("timing", _program_timing)


def _program_timing(program: "Program") -> Timing:
    """The timing of the stored instructions, each LOOP's walk timed from its nest's rows
    (:func:`_predict`), not from ``program.expanded()``: the same pass over the same
    issued instructions, without making them."""
    instructions = program.instructions
    assert all(a.layer <= b.layer for a, b in zip(instructions, instructions[1:]))
    ends, index = {}, -1              # each layer's last issued instruction (but END)
    for instr in instructions:
        index += 1 + (walk_length(instr.fields) if instr.op == Op.LOOP else 0)
        if instr.op != Op.END:
            ends[instr.layer] = index
    stops = list(itertools.accumulate((ends.get(i, -1) for i in range(len(program.layers))),
                                      max))      # a layer without instructions: the last's
    return _predict(instructions, program.config, stops, None, walk=True)


def walk_length(loop) -> int:
    """How many micro-instructions the walker issues for the LOOP ``loop``
    (:func:`~.loops.expand`): a MATMUL and a LOADW per tile, and a POST per output tile."""
    tiles = loop["m_count"] * loop["n_count"] * loop["k1"] * loop["k2"] * loop["k3"]
    return 2 * tiles + loop["m_count"] * loop["n_count"]


def layer_cycles(program: "Program") -> "list[int]":
    """Predicted cycles of each layer: the total of the program truncated after the layer
    minus the total truncated after the previous one (layers overlap in the hardware, so
    this is each layer's share of the timeline). The truncated programs are prefixes of the
    whole one (instructions are in layer order): their totals are the ``stops`` of the
    program's one pass of the cycle model (:func:`program_timing`)."""
    totals = program_timing(program).stops
    return [t - (totals[i - 1] if i else 0) for i, t in enumerate(totals)]


def cycle_windows(program: "Program", cycles: "list[int] | None" = None
                  ) -> "list[tuple[int, int]]":
    """Each layer's window of the timeline, ``(first, end)``: its cycles (``cycles``,
    :func:`layer_cycles`) follow the previous layer's, from the program's start. The
    accelerator's ``cycles`` counter reads ``first`` to ``end - 1`` during the layer's window
    (it reads 0 from the clock edge at which the accelerator takes ``start``), so a trace of
    the run (``hwonnx sim --trace``) shows the layer there; the last window ends at the
    predicted total, when ``done`` rises."""
    cycles = layer_cycles(program) if cycles is None else cycles
    ends = list(itertools.accumulate(cycles))
    return list(zip([0] + ends[:-1], ends))


def cycle_breakdown(program: "Program", cycles: "list[int] | None" = None) -> "list[dict]":
    """Where each layer's predicted cycles (``cycles``, :func:`layer_cycles`) go, from the
    cycle model's timeline of the whole program (:func:`~hwonnx.compiler.timing.predict`):
    layer ``i`` owns the cycles from the end of the program truncated after layer ``i - 1``
    to the end of the one truncated after ``i``. Each of its cycles counts once, as
    ``compute`` if the array is fed a word (a MATMUL issues), else ``weight_loads`` if the
    weight loader (LOADW) or the DMA (LOADX; LOADA, STOREA: activations) is busy, else
    ``boundaries`` (pipeline drain, post-processing tails, element-wise work, dispatch);
    ``host`` is 0 (the host's time is not a layer's: see the report's ``round_trips``). The
    four add up to the layer's cycles."""
    cycles = layer_cycles(program) if cycles is None else cycles
    timing = program_timing(program)
    fed, loading = timing.fed, timing.loading
    windows = cycle_windows(program, cycles)
    starts, ends = [first for first, _ in windows], [end for _, end in windows]
    fed, loading = (np.array(flat, dtype=np.int64).reshape(-1, 2) for flat in (fed, loading))
    compute = _covered(fed, starts, ends)
    busy = _covered(np.concatenate((fed, loading)), starts, ends)
    return [{"compute": c, "weight_loads": b - c, "boundaries": span - b, "host": 0}
            for c, b, span in zip(compute, busy, cycles)]


def _covered(intervals: np.ndarray, starts: "list[int]", ends: "list[int]") -> "list[int]":
    """Cycles of the union of the half-open ``intervals`` (rows first, end) within each
    window [start, end), on whole columns (ResNet-18 with an external memory: 1.8 M)."""
    spans = intervals[intervals[:, 1] > intervals[:, 0]]
    order = np.lexsort((spans[:, 1], spans[:, 0]))
    lows, highs = spans[order, 0], spans[order, 1]
    reach = np.maximum.accumulate(highs)        # the highest end so far: its union's end
    opens = np.ones(len(lows), dtype=bool)      # an interval that begins a union: after
    opens[1:] = lows[1:] > reach[:-1]           # every one before ends (touching: joined)
    first = np.flatnonzero(opens)
    merged_lows = lows[first]
    merged_highs = reach[np.append(first[1:] - 1, len(lows) - 1)] if len(first) else reach
    before = np.concatenate(([0], np.cumsum(merged_highs - merged_lows)))

    def upto(cycles: np.ndarray) -> np.ndarray:        # covered cycles before each cycle
        k = np.searchsorted(merged_lows, cycles, side="right")
        tail = np.maximum(merged_highs[np.maximum(k - 1, 0)] - cycles, 0) if len(first) \
            else np.zeros(len(cycles), dtype=np.int64)
        return np.where(k > 0, before[k] - tail, 0)

    covered = upto(np.array(ends, dtype=np.int64)) - upto(np.array(starts, dtype=np.int64))
    return covered.tolist()
