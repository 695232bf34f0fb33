"""Target boards (installed as ``hwonnx.boards``). This version knows the ``sim`` target: no
board, the accelerator runs in cycle-accurate simulation."""

from dataclasses import dataclass

from ..config import PRESETS, ArchConfig
from ..errors import ResourceError

__all__ = ["Board", "BOARDS", "get_board"]


@dataclass(frozen=True)
class Board:
    """What the compiler needs to know about a target beyond its pinout."""
    name: str
    description: str
    default_config: ArchConfig


BOARDS = {board.name: board for board in [
    Board("sim", "no board: cycle-accurate Verilator simulation", PRESETS["small"]),
]}


def get_board(name: str) -> Board:
    if name not in BOARDS:
        raise ResourceError(f"Unknown board '{name}'; known boards are "
                            f"{', '.join(sorted(BOARDS))}")
    return BOARDS[name]
