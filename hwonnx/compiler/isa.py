"""The instruction set of the accelerator: one flat instruction word whose fields are listed
once here and read by both the compiler (to encode) and the HDL controller (to decode).

``LOADW``  load one weight tile (``rows`` words from ``wgt_addr``) into weight bank ``bank``.
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
"""

from dataclasses import dataclass

__all__ = ["Op", "FIELDS", "Field", "instruction_width", "encode", "decode"]


class Op:
    END = 0
    LOADW = 1
    MATMUL = 2
    POST = 3
    NAMES = {0: "END", 1: "LOADW", 2: "MATMUL", 3: "POST"}


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
    Field("op", 2),
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
    Field("lut", 4),         # POST: activation table + 1 applied to the outputs (0: none)
    Field("dw", 1),          # MATMUL: depthwise streaming (column c reads lane c: see below)
    Field("vstride", 8),     # MATMUL, dw: a sum is kept every vstride words of a row ...
    Field("vlast", 16),      # ... up to word vlast of the row
)


def instruction_width() -> int:
    return sum(f.width for f in FIELDS)


def encode(**values: int) -> int:
    """Pack field values (missing ones are 0) into one instruction word, LSB first."""
    unknown = set(values) - {f.name for f in FIELDS}
    if unknown:
        raise KeyError(f"Unknown instruction fields {sorted(unknown)}")
    word, offset = 0, 0
    for f in FIELDS:
        value = int(values.get(f.name, 0))
        if not f.min <= value <= f.max:
            raise ValueError(f"Instruction field {f.name}={value} does not fit {f.width} "
                             f"{'signed ' if f.signed else ''}bits")
        word |= (value & ((1 << f.width) - 1)) << offset
        offset += f.width
    return word


def decode(word: int) -> "dict[str, int]":
    values, offset = {}, 0
    for f in FIELDS:
        raw = (word >> offset) & ((1 << f.width) - 1)
        if f.signed and raw >> (f.width - 1):
            raw -= 1 << f.width
        values[f.name] = raw
        offset += f.width
    return values
