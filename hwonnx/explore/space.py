"""The design space of ``hwonnx explore``: the array sizes to try (``--rows``, ``--cols``),
the buffer depths (``--depths``), and one point's identity on disk."""

import hashlib
import json
from dataclasses import asdict, dataclass

from ..compiler.sizing import BUFFERS
from ..errors import UsageError

__all__ = ["Point", "parse_sizes", "parse_depths", "sweep_points"]

#: The largest array side :class:`~hwonnx.config.ArchConfig` accepts.
MAX_SIDE = 64


def parse_sizes(text: str, what: str = "--rows") -> "tuple[int, ...]":
    """The array sides ``text`` names, ascending and without repeats: a comma-separated list
    of numbers (``4,8,12``) and ranges ``A..B``, a range standing for the powers of two from A
    to B (``4..16``: 4, 8, 16; ``3..12``: 4, 8).

    Raises
    ------
    UsageError
        If an item is not a number or a range, a side is not from 1 to 64, or a range holds
        no power of two.
    """
    sizes = set()
    for item in str(text).replace(" ", "").split(","):
        low, dots, high = item.partition("..")
        try:
            low, high = int(low), int(high if dots else low)
        except ValueError:
            raise UsageError(f"{what} takes numbers and ranges such as '4,8,16' or '4..16', "
                             f"not {text!r}") from None
        if not (1 <= low <= MAX_SIDE and 1 <= high <= MAX_SIDE):
            raise UsageError(f"{what}: an array side is from 1 to {MAX_SIDE}, not "
                             f"{low if not 1 <= low <= MAX_SIDE else high} (in {text!r})")
        if not dots:
            sizes.add(low)
            continue
        powers = [1 << k for k in range(7) if low <= 1 << k <= high]
        if not powers:
            raise UsageError(f"{what}: the range '{item}' holds no power of two")
        sizes.update(powers)
    return tuple(sorted(sizes))


def parse_depths(text: "str | None") -> "dict[str, int]":
    """``--depths``: ``auto`` (or nothing) sizes every buffer to the model, as ``hwonnx build``
    does; ``act=4096,wgt=2048`` fixes those depths (words) for every point and sizes the
    others; ``lut=N`` fixes the activation tables (``--lut-tables``). Returns the ``build()``
    keywords (``act_depth=4096``, ``lut_tables=N``)."""
    if text is None or str(text).strip() in ("", "auto"):
        return {}
    depths = {}
    names = [b for b in BUFFERS if b != "lut"]
    for item in str(text).replace(" ", "").split(","):
        name, equals, value = item.partition("=")
        if not equals or name not in (*names, "lut") or not value.isdigit():
            raise UsageError(f"--depths takes 'auto' or BUFFER=WORDS items separated by commas "
                             f"(buffers: {', '.join(names)}; lut=N for the activation tables), "
                             f"not {text!r}")
        depths["lut_tables" if name == "lut" else f"{name}_depth"] = int(value)
    return depths


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep: what ``hwonnx build MODEL --board B --rows R --cols C``
    builds (with the fixed ``depths``), and what is done with it."""
    board: str
    rows: int
    cols: int
    depths: "tuple[tuple[str, int], ...]" = ()
    bitstream: bool = False
    sim: int = 0

    @property
    def array(self) -> str:
        return f"{self.rows}x{self.cols}"

    def key(self, inputs: str) -> str:
        """The point's identity on disk: a hash of the point and of ``inputs`` (a digest of
        the model, its calibration data and input shapes, and the simulation inputs), so that
        ``--resume`` never takes a result of another model or configuration."""
        from importlib.metadata import PackageNotFoundError, version
        try:
            release = version("hwonnx")
        except PackageNotFoundError:        # a source tree that is not installed
            release = "source"
        text = json.dumps({"point": asdict(self), "inputs": inputs, "hwonnx": release},
                          sort_keys=True)
        return f"{self.array}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def to_dict(self) -> dict:
        return {"board": self.board, "rows": self.rows, "cols": self.cols,
                "depths": dict(self.depths), "bitstream": self.bitstream, "sim": self.sim}


def sweep_points(board: str, rows, cols, depths: "dict[str, int] | None" = None,
                 bitstream: bool = False, sim: int = 0) -> "list[Point]":
    """Every ``rows`` x ``cols`` configuration, rows first."""
    fixed = tuple(sorted((depths or {}).items()))
    return [Point(board, r, c, fixed, bitstream, sim) for r in rows for c in cols]
