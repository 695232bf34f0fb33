"""Target boards (installed as ``hwonnx.boards``): amaranth-boards platforms with the
capacities, default architectures and clocks hwonnx needs, and the fit check."""

from .fit import Usage, check_board_fit, check_fits, estimate
from .registry import BOARDS, FAMILIES, Board, Family, at_clock, get_board, with_clock

__all__ = ["BOARDS", "Board", "FAMILIES", "Family", "Usage", "at_clock", "check_board_fit",
           "check_fits", "estimate", "get_board", "with_clock"]
