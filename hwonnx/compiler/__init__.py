"""The compiler: integer graph -> program, memory images and cycle predictions."""

from ..isa import FIELDS, LOOP_FIELDS, Op, decode, encode, instruction_width
from .layout import Placement, natural_placement, pack_words, unpack_words
from .lower import lower
from .program import LayerPlan, Program, encode_program
from .timing import Timing, predict

__all__ = ["FIELDS", "LOOP_FIELDS", "LayerPlan", "Op", "Placement", "Program", "Timing", "decode",
           "encode",
           "encode_program", "instruction_width", "lower", "natural_placement", "pack_words",
           "predict", "unpack_words"]
