"""Buffers sized to the model: what each buffer of a compiled program needs, and the
architecture whose depths hold it.

The compiler lowers the model once against :func:`probe` (every buffer as deep as the
instruction fields can address), reads what each buffer needs from the program, and lowers
it again for :func:`sized` depths. A simulation keeps the default depths where they suffice
(so that models share cached simulator builds) and grows the others to the next power of
two; a board build takes each buffer to what the model needs, in whole block-RAM depths
(the depth of one block at its widest port), so that the fit check counts only what is used.
With an external memory, a program longer than two pages of :data:`~.paging.PAGE`
instructions is paged (:mod:`.paging`): its memory is those two pages.
"""

from dataclasses import replace

from ..config import ArchConfig
from ..isa import FIELDS, Op, addressable
from .loops import post_counts
from .paging import PAGE, page_words
from .program import Program

__all__ = ["BUFFERS", "probe", "needs", "sized"]

#: Buffers whose depth follows the model (``<name>_depth`` of :class:`ArchConfig`), and
#: ``lut``, the activation tables (``lut_tables``).
BUFFERS = ("act", "wgt", "par", "prog", "acc", "lut")
_FIELD = {f.name: f for f in FIELDS}


def probe(config: ArchConfig, fixed=()) -> ArchConfig:
    """``config`` with every buffer not in ``fixed`` as deep as an instruction can address
    (the accumulators keep their depth: it sets the tiling; with an external memory, the
    weight and activation buffers keep their depths too: the weights that do not fit stream,
    the tensors that do not fit live in the external memory)."""
    limits = {"par": addressable("par")}
    if not config.prog_page:            # a paged program's memory is two pages of any program
        limits["prog"] = 1 << 16
    if not config.ext_memory:
        limits.update(act=addressable("act"), wgt=addressable("wgt"))
    changes = {f"{name}_depth": depth for name, depth in limits.items() if name not in fixed}
    if "lut" not in fixed:
        changes["lut_tables"] = _FIELD["lut"].max
    return replace(config, **changes)


def needs(program: Program) -> "dict[str, int]":
    """Words each buffer of ``program`` uses; for the accumulators, the depth beyond which
    no M tile grows (twice the largest output tile, both halves in use); ``ext``: the words
    of the external memory the program uses (its image, and the tensors that live there)."""
    return {**program.words, "acc": 2 * _largest_post(program),
            "lut": len(program.images.get("lut", ())) // 256,
            "ext": program.words.get("ext", len(program.images.get("ext", ())))}


def _largest_post(program: Program) -> int:
    """The largest ``count`` of a POST that ``program`` issues (1: none), from its stored
    instructions (a loop's POSTs: :func:`~.loops.post_counts`)."""
    largest, setpost = 1, None
    for instr in program.instructions:
        if instr.op == Op.POST:
            largest = max(largest, instr["count"])
        elif instr.op == Op.SETPOST:
            setpost = instr.fields
        elif instr.op == Op.LOOP:
            largest = max(largest, *post_counts(setpost, instr.fields))
    return largest


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def sized(config: ArchConfig, words: "dict[str, int]", fixed=(),
          block_depth: "int | None" = None) -> ArchConfig:
    """``config`` with the depths of the buffers not in ``fixed`` sized to ``words``: for a
    board (``block_depth``: a block RAM's depth at its widest port), what is needed in whole
    blocks (the accumulators: a power of two, at
    most ``config``'s; the activation tables: those used); otherwise ``config``'s depth or,
    where that is short, the next power of two (the tables: as many as used)."""
    changes = {}
    extra = 0                           # external words of the program's pages
    if "prog" not in fixed and config.ext_memory and not config.runtime_program \
            and not config.prog_page and words["prog"] > 2 * PAGE:
        changes.update(prog_page=PAGE, prog_depth=2 * PAGE)
        extra = page_words(words["prog"], PAGE, config.cols)
    for name in BUFFERS:
        if name in fixed or (name == "prog" and (config.prog_page or "prog_page" in changes)):
            continue
        board = block_depth is not None
        if name == "lut":
            used = words["lut"]
            changes["lut_tables"] = used if board else max(config.lut_tables, used)
            continue
        current, need = getattr(config, f"{name}_depth"), max(1, words[name])
        if name == "acc":
            depth = min(current, max(2, _pow2(need))) if board else current
        elif board:
            depth = -(-need // block_depth) * block_depth
        else:
            depth = max(current, _pow2(need))
        changes[f"{name}_depth"] = depth
    if config.ext_memory and block_depth is None:     # a simulation's memory model: what is
        changes["ext_depth"] = min(config.ext_depth,
                                   _pow2(max(1, words.get("ext", 0) + extra)))   # used
    return replace(config, **changes)
