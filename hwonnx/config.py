"""The architecture configuration: the single source of truth for the compiler, the HDL, the
simulator and the board fit check."""

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from .isa import (MAX_LUT_TABLES, PARAM_BITS, addressable, ext_words_per_instruction,
                  instruction_width)
from .memories import MEMORIES, ExtTiming

__all__ = ["ArchConfig", "PRESETS"]


def _bits(depth: int) -> int:
    return max(1, (depth - 1).bit_length())


def _max_page(cols: int) -> int:
    """The largest ``prog_page`` whose two pages one LOADP copies."""
    return 1 << ((((1 << 16) - 1) // (2 * ext_words_per_instruction(cols))).bit_length() - 1)


#: The host-writable buffers, in the order the accelerator declares them.
_BUFFERS = ("prog", "wgt", "par", "act", "lut")


@dataclass(frozen=True)
class ArchConfig:
    """Geometry, number formats and buffer depths of the accelerator.

    The array is weight-stationary: ``rows`` is the reduction (input-channel) dimension of a
    tile, ``cols`` the output-channel dimension. Every generator reads the architecture from
    this one object; nothing else hard-codes a width or a depth.

    Parameters
    ----------
    rows, cols : array geometry (``rows`` int8 lanes per activation word, ``cols`` per weight
        word).
    act_depth : words of ``rows`` int8 in the activation buffer.
    wgt_depth : words of ``cols`` int8 in the weight buffer (a weight tile is ``rows`` words).
    acc_depth : words of ``cols`` int32 in the accumulator buffer (split in two halves so that
        post-processing of one output tile overlaps the computation of the next).
    par_depth : words of post-processing parameters (bias, multiplier, shift for ``cols``
        channels); one per layer and group of ``cols`` output channels.
    prog_depth : instructions in the program buffer.
    prog_width : bits of one program-memory word, or 0 (the default) for one whole instruction
        per word. A narrower word stores each instruction as ``fetch_words`` consecutive words
        that the fetch unit reads one per cycle (documented in ``docs/architecture.md``); the
        memory is then single-ported without initial contents, so that it maps onto iCE40
        SPRAM, and the host loads the program over the host link at run time.
    prog_page : 0 (the default: the whole program is in the program memory) or, with an
        external memory, the instructions of one page of a *paged* program, a power of two:
        the program memory holds two pages (``prog_depth = 2 * prog_page``) and the program
        loads each next page from the external memory while it runs the one before
        (``LOADP``, :mod:`hwonnx.compiler.paging`), so a program of any length takes a few
        block RAMs.
    ort_rounding : the post-processor can also round as onnxruntime's int8 kernels do (a
        float32 multiply, ties to even: ``hdl/rounding.py``), chosen per layer; it adds three
        pipeline stages and about 400 logic cells per column.
    lut_tables : activation tables (256 int8 entries each: LeakyRelu, Sigmoid, Tanh,
        HardSigmoid, HardSwish) the post-processor can hold, 0 to 63; with any, each column
        has a table memory of ``256 * lut_tables`` bytes and the pipeline one more stage.
    walker : the tile walker (``hdl/walker.py``) that expands a looped layer (SETMM, SETPOST,
        LOOP) in hardware, so that a layer takes three instructions instead of one per tile.
        It holds two instruction words and a LOOP (about 1,250 flip-flops); without it, as on
        the smallest iCE40 boards, every tile is stored.
    eltwise : the element-wise engine (``hdl/eltwise.py``) for Add/Sub/Mul/Max/Min of two
        computed tensors: a 9x18 multiplier per lane (``min(rows, cols)`` lanes; the
        compiler uses it only when ``cols >= rows``: ``eltwise_engine``). Without it a residual
        ``Add`` of two equal shapes is a ``QAdd`` on the array and the other such layers are
        refused.
    ext_memory, ext_depth : the external memory behind the DMA engine (``hdl/dma.py``): the
        name of its timing in :data:`hwonnx.memories.MEMORIES` and its size in weight
        words; ``""`` and 0 (the default) for none. Layers whose weights do not fit the weight
        buffer then stream from it (``docs/architecture.md``, "External memory").
    mul_stages : register stages of the post-processor's 32x32 multiply: 5 (the default; its
        operands, three 18x18 products (Karatsuba), again, their middle term, the product: every
        stage short enough for a fast clock, with registers on either side of each
        multiplier) or 1 (fewer flip-flops, about 230 a column, for the smallest devices,
        whose clock does not need it: ``hdl/post.py``). With 1 the datapath is the compact
        one throughout: the rounding shift in one stage (``post.round_stages``) and the
        activation word straight from its block RAM into the array (``feeder.feed_delay``).
    post_lanes : requantizers of the post-processor (``hdl/post.py``): 0 (the default) for
        one per column, or a divisor of ``cols``: each then requantizes ``cols / post_lanes``
        columns, one per cycle, so that a POST takes that many cycles per accumulator word and
        activation word (``post_passes``), and the 32x32 multipliers (three 18x18 blocks a
        lane) and about 1,000 logic cells a lane are left to the array (the 16x16 array on an
        85k-LUT ECP5). The pipelined datapath only (``mul_stages`` 5), without
        ``ort_rounding``.
    stage_in_depth, stage_out_depth : with an external memory, words of the two staging
        buffers through which tensors too large for the activation buffer move (0 and 0, the
        default: none). The input staging buffer takes activation addresses ``[act_depth,
        act_depth + stage_in_depth)`` (LOADA writes it, the feeder and the element-wise engine
        read it), the output one the next ``stage_out_depth`` (the post-processor writes it,
        STOREA reads it): each its own memory, so that the transfers run beside the
        computation (``hwonnx.compiler.spill``).
    """
    rows: int = 8
    cols: int = 8
    act_depth: int = 8192
    wgt_depth: int = 4096
    acc_depth: int = 1024
    par_depth: int = 256
    prog_depth: int = 4096
    prog_width: int = 0
    prog_page: int = 0
    ort_rounding: bool = False
    lut_tables: int = 4
    walker: bool = True
    eltwise: bool = True
    data_width: int = 8
    acc_width: int = 32
    clock_hz: int = 50_000_000
    ext_memory: str = ""
    ext_depth: int = 0
    stage_in_depth: int = 0
    stage_out_depth: int = 0
    mul_stages: int = 5
    post_lanes: int = 0

    def __post_init__(self):
        for name in ("rows", "cols", "act_depth", "wgt_depth", "acc_depth", "par_depth",
                     "prog_depth", "clock_hz"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ArchConfig.{name} must be a positive integer, not {value!r}")
        if self.rows > 64 or self.cols > 64:
            raise ValueError(f"ArchConfig array must be at most 64x64, not "
                             f"{self.rows}x{self.cols}")
        if self.data_width != 8 or self.acc_width != 32:
            raise ValueError(f"ArchConfig supports int8 data with int32 accumulation only, not "
                             f"{self.data_width}/{self.acc_width} bits")
        for flag in ("ort_rounding", "walker", "eltwise"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"ArchConfig.{flag} must be a bool, not "
                                 f"{getattr(self, flag)!r}")
        if not isinstance(self.lut_tables, int) or isinstance(self.lut_tables, bool) \
                or not 0 <= self.lut_tables <= MAX_LUT_TABLES:
            raise ValueError(f"ArchConfig.lut_tables must be an integer from 0 to "
                             f"{MAX_LUT_TABLES}, not "
                             f"{self.lut_tables!r}")
        if self.mul_stages not in (1, 5) or isinstance(self.mul_stages, bool):
            raise ValueError(f"ArchConfig.mul_stages must be 1 or 5, not {self.mul_stages!r}")
        if not isinstance(self.post_lanes, int) or isinstance(self.post_lanes, bool) \
                or self.post_lanes < 0 or (self.post_lanes and self.cols % self.post_lanes):
            raise ValueError(f"ArchConfig.post_lanes must be 0 or a divisor of cols "
                             f"({self.cols}), not {self.post_lanes!r}")
        if self.post_passes > 1 and (self.mul_stages != 5 or self.ort_rounding):
            raise ValueError("ArchConfig.post_lanes fewer than cols needs mul_stages 5 and no "
                             "ort_rounding")
        if self.prog_width < 0 or self.prog_width % 8 or self.prog_width > instruction_width():
            raise ValueError(f"ArchConfig.prog_width must be 0 or a multiple of 8 up to "
                             f"{instruction_width()}, not {self.prog_width!r}")
        if self.ext_memory not in ("", *MEMORIES) or not isinstance(self.ext_depth, int) \
                or isinstance(self.ext_depth, bool) or self.ext_depth < 0 \
                or bool(self.ext_memory) != bool(self.ext_depth):
            raise ValueError(f"ArchConfig.ext_memory must be one of {sorted(MEMORIES)} with a "
                             f"positive ext_depth, or '' with 0, not {self.ext_memory!r} with "
                             f"{self.ext_depth!r}")
        if self.ext_memory and self.ext_depth > MEMORIES[self.ext_memory].words(self.cols):
            raise ValueError(f"ArchConfig.ext_depth must be at most the "
                             f"{MEMORIES[self.ext_memory].words(self.cols)} words of "
                             f"{self.cols} bytes that {self.ext_memory!r} holds, not "
                             f"{self.ext_depth}")
        if self.prog_page and (not isinstance(self.prog_page, int) or self.prog_page < 2
                               or self.prog_page & (self.prog_page - 1)
                               or self.prog_depth != 2 * self.prog_page
                               or not self.ext_memory or self.prog_width):
            raise ValueError(f"ArchConfig.prog_page must be 0 or a power of two of at least 2 "
                             f"with prog_depth twice as deep, an external memory and no "
                             f"prog_width, not {self.prog_page!r} (prog_depth "
                             f"{self.prog_depth}, ext_memory {self.ext_memory!r}, prog_width "
                             f"{self.prog_width})")
        if self.prog_page and self.prog_depth * ext_words_per_instruction(self.cols) >= 1 << 16:
            raise ValueError(f"ArchConfig.prog_page must be at most {_max_page(self.cols)} "
                             f"for {self.cols} columns (a LOADP copies at most 65,535 "
                             f"words), not {self.prog_page}")
        stages = (self.stage_in_depth, self.stage_out_depth)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in stages) \
                or (any(stages) and not (all(stages) and self.ext_memory)):
            raise ValueError(f"ArchConfig.stage_in_depth and stage_out_depth must be 0 or, with "
                             f"an external memory, both positive integers, not {stages}")
        if self.act_depth + sum(stages) > addressable("act"):
            raise ValueError(f"ArchConfig.act_depth plus the staging depths must be at most the "
                             f"{addressable('act')} activation words instructions address, "
                             f"not {self.act_depth} + {stages}")
        if self.acc_depth < 2 or self.acc_depth % 2:
            raise ValueError(f"ArchConfig.acc_depth must be even and at least 2, not "
                             f"{self.acc_depth}")

    @property
    def eltwise_engine(self) -> bool:
        """Whether the compiler can use the element-wise engine: it has one (``eltwise``) and
        as many columns as rows (the engine writes an activation word's ``rows`` lanes into
        one accumulator word)."""
        return self.eltwise and self.cols >= self.rows

    # Derived widths -------------------------------------------------------------------------
    @property
    def ext_timing(self) -> "ExtTiming | None":
        """The timing of the external memory (None without one)."""
        return MEMORIES.get(self.ext_memory)

    @property
    def macs_per_cycle(self) -> int:
        return self.rows * self.cols

    @property
    def act_addr_bits(self) -> int:
        """Bits of an activation address: the buffer's and the staging buffers'."""
        return _bits(self.act_depth + self.stage_in_depth + self.stage_out_depth)

    @property
    def stage_bases(self) -> "tuple[int, int]":
        """The first activation address of the input and of the output staging buffer."""
        return self.act_depth, self.act_depth + self.stage_in_depth

    @property
    def wgt_addr_bits(self) -> int:
        return _bits(self.wgt_depth)

    @property
    def acc_addr_bits(self) -> int:
        return _bits(self.acc_depth)

    @property
    def par_addr_bits(self) -> int:
        return _bits(self.par_depth)

    @property
    def fetch_words(self) -> int:
        """Program-memory words per instruction (1 unless ``prog_width`` is set)."""
        return -(-instruction_width() // self.prog_width) if self.prog_width else 1

    @property
    def prog_words(self) -> int:
        """Depth of the program memory in words."""
        return self.prog_depth * self.fetch_words

    @property
    def prog_word_bits(self) -> int:
        return self.prog_width or instruction_width()

    @property
    def runtime_program(self) -> bool:
        """The program is written over the host link before each model is run, not baked into
        the memory's initial contents."""
        return self.prog_width != 0

    @property
    def prog_addr_bits(self) -> int:
        return _bits(self.prog_words)

    @property
    def lut_depth(self) -> int:
        """Entries of each column's activation-table memory (0: no tables)."""
        return 256 * self.lut_tables

    @property
    def acc_half(self) -> int:
        """Accumulator words available to one output tile."""
        return self.acc_depth // 2

    @property
    def buffers(self) -> "tuple[str, ...]":
        """The accelerator's host-writable buffers (the activation tables only with
        ``lut_tables``)."""
        return _BUFFERS if self.lut_tables else _BUFFERS[:-1]

    def buffer_shape(self, name: str) -> "tuple[int, int]":
        """Depth and word width in bits of buffer ``name`` (``ext``: the external memory,
        which is not part of the accelerator)."""
        return {
            "prog": (self.prog_words, self.prog_word_bits),
            "wgt": (self.wgt_depth, self.cols * 8),
            "par": (self.par_depth, self.cols * PARAM_BITS),
            "act": (self.act_depth, self.rows * 8),
            "lut": (self.lut_depth, 8),
            "ext": (self.ext_depth, self.cols * 8),    # the external memory's words
        }[name]

    # Serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ArchConfig":
        data = json.loads(text)
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"ArchConfig JSON has unknown fields {sorted(unknown)}")
        return cls(**data)

    @property
    def post_lanes_used(self) -> int:
        """The post-processor's requantizers (``post_lanes``, or one per column)."""
        return self.post_lanes or self.cols

    @property
    def post_passes(self) -> int:
        """Cycles of a POST per accumulator word and activation word: the columns each
        requantizer serves."""
        return self.cols // self.post_lanes_used

    @property
    def compact(self) -> bool:
        """The compact datapath of the smallest devices (``mul_stages`` 1): fewer pipeline
        registers in the post-processor, before the array and behind the feeder's ``drained``
        (``hdl/post.py``, ``hdl/feeder.py``); the same cycles either way but for those of
        ``feed_delay`` and the post-processor's stages."""
        return self.mul_stages == 1

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols}"

    def digest(self) -> str:
        """Short stable hash of every field (part of the RTL build cache key)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]


PRESETS = {
    "tiny": ArchConfig(rows=4, cols=4, act_depth=4096, wgt_depth=2048, acc_depth=512),
    "small": ArchConfig(),
    "large": ArchConfig(rows=16, cols=16, act_depth=8192, wgt_depth=2048, acc_depth=2048),
}
PRESETS["wide"] = replace(PRESETS["small"], cols=16)
