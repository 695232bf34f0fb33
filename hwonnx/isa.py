"""The instruction set of the accelerator: one flat instruction word whose fields are listed
once here and read by both the compiler (to encode) and the HDL controller (to decode).

``LOADW``  load one weight tile (``rows`` words from ``wgt_addr``) into weight bank ``bank``;
           with ``wpack`` p > 0 the tile is ``ceil(rows / 2**p)`` words, each lane byte
           holding the weights of 2**p rows in 8 >> p bits (:mod:`hwonnx.hdl.loader`).
``MATMUL`` stream ``count`` activation words through the array using weight bank ``bank`` and
           accumulate (``first``: overwrite) into accumulator words from ``acc_addr``. The
           activation addresses follow the im2col walk described in ``docs/architecture.md``.
           With ``pool_max`` the accumulators keep the largest sum instead (max pooling).
           With ``dw`` (depthwise streaming) column ``c`` multiplies lane ``c`` of the word
           in flight ``r`` words later in row ``r``, so each column is a 1-D convolution
           along the stream, and only every ``vstride``-th word of a row, up to ``vlast``,
           writes an accumulator (the next one).
``POST``   requantize ``count`` accumulator words into activation words (bias, multiplier,
           shift, zero point, clamp) and write them from ``out_addr``; ``lut`` > 0 maps each
           value through activation table ``lut - 1``.
``END``    wait until every engine is idle, then raise ``done``.

A layer whose tiles follow a regular nest (output-pixel tiles M, channel tiles N, and a
reduction of K = K1 x K2 x K3 tiles: kernel rows, kernel columns or sources, channel blocks)
takes three instructions instead of one per tile, expanded by the tile walker
(``hdl/walker.py``, reference :func:`hwonnx.compiler.loops.expand`):

``SETMM``  the MATMUL of the layer's first tile, kept by the walker as a template;
``SETPOST`` the POST of its first output tile, kept the same way;
``LOOP``   walk the nest (:data:`LOOP_FIELDS`): for every tile the walker issues LOADW,
           MATMUL and POST micro-instructions to the engines, exactly as the compiler would
           list them one by one (:func:`hwonnx.compiler.loops.schedule`), the fields that
           move from tile to tile stepped by the LOOP's increments.

``ELTW``   the element-wise engine (:data:`ELTW_FIELDS`, its own layout of the word): for
           ``i < count`` read activation word A at ``a_addr + i * a_stride`` and word B at
           ``b_addr + i * b_stride`` (``b_stride`` 0: one per-channel word for every pixel),
           and write per lane ``p = (a - za) * ((b - zb) if mul else ka)``,
           ``q = (b - zb) * kb`` combined as ``p + q``, ``max(p, q)`` or ``min(p, q)``
           (``mode`` 0, 1, 2) into accumulator word ``acc_addr + i``; the POST after it
           requantizes them (:func:`hwonnx.golden.qeltwise`).

``LOADX``  the DMA engine (:data:`LOADX_FIELDS`, its own layout): copy ``count`` weight words
           from external-memory word ``ext_addr`` into the weight buffer from ``wgt_addr``, in
           bursts over the external memory port (``hdl/dma.py``), then ``par_count`` external
           words from ``par_ext`` into the parameter buffer from word ``par_addr``, each
           parameter word :data:`EXT_WORDS_PER_PARAM` words, least significant first (the
           parameters of the layer whose weights stream). Accepted only when the DMA is idle
           and the weight loader has finished (with parameters, also the post-processor: the
           POSTs before it have read the words it may overwrite), so a LOADX is also the
           fence that makes the words of the one before it visible to the LOADWs and POSTs
           after it.
``LOADA``  the DMA engine (:data:`ACTX_FIELDS`): copy ``count`` activation words from
           external-memory word ``ext_addr`` into the activation buffer from ``act_addr``;
``STOREA`` ... and back: ``count`` activation words from ``act_addr`` into the external memory
           from ``ext_addr``. A LOADA writes only the input staging buffer, a STOREA reads
           only the output one (``ArchConfig.stage_in_depth``, ...), so both run beside the other
           engines: the DMA engine holds one more transfer while it runs one. A LOADA is
           accepted once the MATMULs and ELTWs before it have read their operands, a STOREA
           once the POSTs before it have written theirs; with ``fence``, only once the DMA
           engine is idle (every transfer before it done). A tensor too large for the
           activation buffer lives in the external memory; a layer reads and writes it in
           bands of rows through the staging buffers, :mod:`hwonnx.compiler.spill`.
``LOADP``  the DMA engine (:data:`LOADP_FIELDS`, LOADX's layout): copy ``count`` external
           words from ``ext_addr`` into the program memory from instruction ``prog_addr``,
           each instruction :func:`ext_words_per_instruction` words, least significant
           first: a paged program (``ArchConfig.prog_page``, :mod:`hwonnx.compiler.paging`)
           loads its next page while it runs this one. Accepted when the DMA is idle.

Op codes 12 to 15 are free for more engines.
"""

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Op", "FIELDS", "LOOP_FIELDS", "ELTW_FIELDS", "LOADX_FIELDS", "LOADP_FIELDS",
           "ACTX_FIELDS", "ELTW_MODES", "Field", "OP_BITS", "PARAM_BITS",
           "instruction_width", "ext_words_per_instruction", "EXT_WORDS_PER_PARAM", "encode",
           "decode", "fields_of", "addressable", "MAX_LUT_TABLES"]

#: Bits of post-processing parameters per output channel: bias (32), multiplier (32), shift
#: (8) (``hdl/layouts.py: ParamLayout``).
PARAM_BITS = 72
#: External-memory words (``cols`` bytes) that hold one parameter word (``cols`` channels'
#: parameters; LOADX's ``par_count``).
EXT_WORDS_PER_PARAM = PARAM_BITS // 8

#: Bits of the op code, the first field of every instruction.
OP_BITS = 4


class Op(IntEnum):
    """The op codes of the instruction word (its ``op`` field, bits 0-3). Members are ints
    (``Op.POST == 3``, and Amaranth compares a signal with one as with its value); ``str``
    gives the number on every Python version, as ``format`` does. :data:`Op.NAMES`,
    :data:`Op.ACTX`, :data:`Op.DMA` and :data:`Op.WALKER` are plain data beside them."""
    END = 0
    LOADW = 1
    MATMUL = 2
    POST = 3
    SETMM = 4
    SETPOST = 5
    LOOP = 6
    ELTW = 7
    LOADX = 8
    LOADA = 9
    STOREA = 10
    LOADP = 11

    __str__ = int.__repr__          # Python 3.10's IntEnum would give 'Op.POST'


# Set after the class, so that the enum does not take them for members (enum.nonmember is
# Python 3.11 only).
#: Each op code's name.
Op.NAMES = {0: "END", 1: "LOADW", 2: "MATMUL", 3: "POST", 4: "SETMM", 5: "SETPOST", 6: "LOOP",
            7: "ELTW", 8: "LOADX", 9: "LOADA", 10: "STOREA", 11: "LOADP"}
#: The activation transfers of the DMA engine.
Op.ACTX = (9, 10)
#: Every instruction of the DMA engine.
Op.DMA = (8, 9, 10, 11)
#: Instructions the dispatcher hands to the walker, not to an engine.
Op.WALKER = (4, 5, 6)


@dataclass(frozen=True)
class Field:
    name: str
    width: int
    signed: bool = False

    @property
    def min(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


# Fixed widths keep the encoding independent of the buffer depths; the compiler range-checks
# every value against the configured depths separately.
FIELDS: "tuple[Field, ...]" = (
    Field("op", OP_BITS),
    Field("bank", 1),
    Field("wait", 1),        # MATMUL: start only when the post-processor is idle
    Field("first", 1),       # MATMUL: overwrite the accumulators instead of adding
    Field("count", 16),      # MATMUL: activation words; POST: accumulator words
    Field("wgt_addr", 16),
    Field("acc_addr", 16),
    Field("act_addr", 24, signed=True),  # MATMUL: address of the first input pixel word
    Field("act_row", 24, signed=True),  # MATMUL: address of the first pixel's output row start
    Field("ow", 16),         # output width of the im2col walk
    Field("ox0", 16),        # output column of the first pixel
    Field("ih", 16),
    Field("iw", 16),
    Field("iy0", 17, signed=True),       # input row/column of the first pixel
    Field("ix0", 17, signed=True),
    Field("ixr", 17, signed=True),       # input column at the start of each output row
    Field("sy", 8),
    Field("sx", 8),
    Field("step_x", 24, signed=True),    # address step per output column
    Field("step_y", 24, signed=True),    # address step per output row (from the row start)
    Field("zp", 8, signed=True),         # MATMUL: padding value; POST: output zero point
    Field("par_addr", 16),
    Field("out_addr", 24),
    Field("out_stride", 16),
    Field("nw", 8),          # POST: activation words written per accumulator word
    Field("lane_off", 8),    # POST: lane of the first output channel in the first word
    Field("nt", 8),          # POST: valid output channels (columns)
    Field("lo", 8, signed=True),
    Field("hi", 8, signed=True),
    Field("rne", 1),         # POST: onnxruntime's rounding (needs ArchConfig.ort_rounding)
    Field("pool_max", 1),    # MATMUL: keep the maximum of the sums instead of adding them
    Field("lut", 6),         # POST: activation table + 1 applied to the outputs (0: none)
    Field("dw", 1),          # MATMUL: depthwise streaming (column c reads lane c: see below)
    Field("vstride", 8),     # MATMUL, dw: a sum is kept every vstride words of a row ...
    Field("vlast", 16),      # ... up to word vlast of the row
    Field("wpack", 2),       # LOADW (SETMM: its tiles'): weights packed 2**wpack per lane byte
)


#: The fields of a LOOP instruction (its own layout of the same word). Tile ``t`` of a layer is
#: ``(m, n, k1, k2, k3)`` in nest order; a field with a step moves by it when its loop level
#: advances (the inner levels starting over); ``*_last`` values replace the template's in the
#: last M or N tile. A POST's ``nw`` is ``(lane_off + nt - 1) // rows + 1``.
LOOP_FIELDS: "tuple[Field, ...]" = (
    Field("op", OP_BITS),
    Field("bank", 1),        # weight bank of the first tile
    Field("acc", 1),         # accumulator half of the first output tile
    Field("m_count", 16),    # M tiles (output-pixel blocks)
    Field("n_count", 16),    # N tiles (output-channel blocks)
    Field("k1", 16),         # K tiles per output tile: k1 x k2 x k3
    Field("k2", 16),
    Field("k3", 16),
    Field("w1", 16),         # weight address of the second tile (its LOADW comes early)
    Field("count_last", 16),         # MATMUL count in the last M tile
    Field("post_count_last", 16),    # POST count in the last M tile
    Field("nt_last", 8),     # POST nt in the last N tile (nw follows from lane_off and nt)
    Field("act_k3", 24, signed=True),    # MATMUL act_addr (and act_row) steps
    Field("act_k2", 24, signed=True),
    Field("act_k1", 24, signed=True),
    Field("act_n", 24, signed=True),
    Field("act_m", 24, signed=True),
    Field("iy_k1", 17, signed=True),     # MATMUL iy0 steps
    Field("iy_m", 17, signed=True),
    Field("ix_k2", 17, signed=True),     # MATMUL ix0 (and ixr) steps
    Field("ix_k1", 17, signed=True),
    Field("par_n", 8),       # POST par_addr step per N tile
    Field("word_n", 16),     # POST out_addr step per N tile, beside the lane step:
    Field("lane_n", 8),      # lane_off += lane_n, and a lane past the word carries 1
    Field("out_m", 24),      # POST out_addr step per M tile
)


#: The fields of an ELTW instruction (its own layout of the same word).
ELTW_FIELDS: "tuple[Field, ...]" = (
    Field("op", OP_BITS),
    Field("wait", 1),        # start only when the post-processor is idle
    Field("mode", 2),        # ELTW_MODES: how the lane's two products are combined
    Field("mul", 1),         # the second product is (a - za) * (b - zb) instead of (b - zb) * kb
    Field("count", 16),      # words (pixels)
    Field("acc_addr", 16),   # first accumulator word written
    Field("a_addr", 24),     # first word of operand A ...
    Field("b_addr", 24),     # ... and of operand B
    Field("a_stride", 16),   # word steps per pixel (B: 0 broadcasts one word)
    Field("b_stride", 16),
    Field("za", 8, signed=True),         # zero points
    Field("zb", 8, signed=True),
    Field("ka", 18, signed=True),        # integer weights of the two operands
    Field("kb", 18, signed=True),
)

#: The fields of a LOADX instruction (its own layout of the same word).
LOADX_FIELDS: "tuple[Field, ...]" = (
    Field("op", OP_BITS),
    Field("count", 16),      # weight words copied
    Field("wgt_addr", 16),   # first weight-buffer word written
    Field("ext_addr", 32),   # first external-memory word read (words of cols bytes)
    Field("par_count", 16),  # then external words copied into the parameter buffer
    Field("par_addr", 16),   # first parameter-buffer word written
    Field("par_ext", 32),    # first external-memory word of the parameters
)

#: The fields of LOADP: LOADX's layout (its first fields), so that the DMA engine decodes
#: both alike.
LOADP_FIELDS: "tuple[Field, ...]" = (
    Field("op", OP_BITS),
    Field("count", 16),      # external words copied (whole instructions)
    Field("prog_addr", 16),  # first program-memory instruction written
    Field("ext_addr", 32),   # first external-memory word read
)
assert [f.width for f in LOADP_FIELDS] == [f.width for f in LOADX_FIELDS[:4]]

#: The fields of LOADA and STOREA (their own layout of the same word).
ACTX_FIELDS: "tuple[Field, ...]" = (
    Field("op", OP_BITS),
    Field("fence", 1),       # accepted only when the DMA engine is idle
    Field("count", 24),      # activation words copied
    Field("act_addr", 24),   # first activation-buffer word
    Field("ext_addr", 32),   # first external-memory word (words of rows = cols bytes)
)

#: ELTW ``mode`` values (``hwonnx.golden.ops.ELTWISE_MODES`` in this order).
ELTW_MODES = {"sum": 0, "max": 1, "min": 2}


#: The most activation tables a POST can name (its ``lut`` field holds the table + 1):
#: ``ArchConfig.lut_tables`` is at most this (MobileNetV3 and LCNet need 16 to 20).
MAX_LUT_TABLES = next(f for f in FIELDS if f.name == "lut").max


def instruction_width() -> int:
    return sum(f.width for f in FIELDS)


def ext_words_per_instruction(cols: int) -> int:
    """External-memory words (``cols`` bytes) that hold one instruction (LOADP)."""
    return -(-instruction_width() // (8 * cols))


def addressable(buffer: str) -> int:
    """Words of buffer ``wgt``, ``par`` or ``act`` that instructions can address."""
    field = {f.name: f for f in FIELDS}
    if buffer == "act":
        return min(field["act_addr"].max, field["out_addr"].max) + 1
    return field[f"{buffer}_addr"].max + 1


def fields_of(op: int) -> "tuple[Field, ...]":
    """The layout of an instruction with op code ``op``."""
    return {Op.LOOP: LOOP_FIELDS, Op.ELTW: ELTW_FIELDS, Op.LOADX: LOADX_FIELDS,
            Op.LOADP: LOADP_FIELDS, Op.LOADA: ACTX_FIELDS, Op.STOREA: ACTX_FIELDS}.get(op, FIELDS)


def encode(**values: int) -> int:
    """Pack field values (missing ones are 0) into one instruction word, LSB first, in the
    layout of its op code (:func:`fields_of`)."""
    layout = fields_of(int(values.get("op", 0)))
    unknown = set(values) - {f.name for f in layout}
    if unknown:
        raise KeyError(f"Unknown instruction fields {sorted(unknown)}")
    word, offset = 0, 0
    for f in layout:
        value = int(values.get(f.name, 0))
        if not f.min <= value <= f.max:
            raise ValueError(f"Instruction field {f.name}={value} does not fit {f.width} "
                             f"{'signed ' if f.signed else ''}bits")
        word |= (value & ((1 << f.width) - 1)) << offset
        offset += f.width
    return word


def decode(word: int) -> "dict[str, int]":
    values, offset = {}, 0
    for f in fields_of(word & ((1 << OP_BITS) - 1)):
        raw = (word >> offset) & ((1 << f.width) - 1)
        if f.signed and raw >> (f.width - 1):
            raw -= 1 << f.width
        values[f.name] = raw
        offset += f.width
    return values


assert sum(f.width for f in LOOP_FIELDS) <= instruction_width(), "LOOP must fit the word"
assert sum(f.width for f in ELTW_FIELDS) <= instruction_width(), "ELTW must fit the word"
assert sum(f.width for f in LOADX_FIELDS) <= instruction_width(), "LOADX must fit the word"
assert sum(f.width for f in ACTX_FIELDS) <= instruction_width(), "LOADA must fit the word"
