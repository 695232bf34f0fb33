"""Paged programs (``ArchConfig.prog_page``): the program lives in the external memory and
runs a page at a time, so a program of any length takes a program memory of two pages.

The program memory holds two pages of ``P = prog_page`` instructions. The program is at the
start of the external memory, before the streamed weights and the tensors that live there,
each instruction :func:`~hwonnx.isa.ext_words_per_instruction` words (least significant
first), page ``k`` from word ``k P`` of those, and at least two pages long. In the cycle after
``start`` the DMA engine copies the first two pages into the program memory (the *boot*
LOADP, ``hdl/top.py``); page ``k >= 2`` goes into half ``k mod 2``, over page ``k - 2``: the
first instruction of page ``k - 1`` is the LOADP that copies it, so page ``k - 2`` has been
dispatched. The dispatcher takes the first instruction of every page only once the DMA engine
is idle (its LOADP done), and its program counter counts modulo ``2 P``. Every run starts from
the external memory, so the program memory has no initial contents and a run leaves nothing
the next one depends on.

:func:`paged` turns a lowered program into this form; :func:`unpaged` is its inverse (the
program that :func:`truncated` cuts and pages again).
"""

from dataclasses import replace

from ..errors import ResourceError
from ..isa import Op, ext_words_per_instruction
from .program import Instr, Port, Program, encode_instructions, mark_layers

__all__ = ["PAGE", "page_lengths", "page_words", "pages_words", "paged", "unpaged",
           "ext_pages", "truncated"]

#: Instructions per page of a program the build pages: two pages are 512 words of 419 bits,
#: 12 block RAMs of an ECP5 (512 x 36 bits each) for a program of any length.
PAGE = 256


def page_lengths(n: int, page: int) -> "list[int]":
    """Instructions of an unpaged program of ``n`` each page holds (not counting its LOADP):
    the boot copies pages 0 and 1, so pages 1 to N-2 begin with the LOADP of the next."""
    if n <= 2 * page:
        return [min(n, page)] + ([n - page] if n > page else [])
    middle = -(-(n - 2 * page) // (page - 1))        # pages 1 .. N-2, P - 1 each
    return [page] + [page - 1] * middle + [n - page - middle * (page - 1)]


def page_words(n: int, page: int, cols: int) -> int:
    """External-memory words the pages of an unpaged program of ``n`` instructions take
    (with their LOADPs, at least two pages)."""
    loadps = max(0, len(page_lengths(n, page)) - 2)
    return max(n + loadps, 2 * page) * ext_words_per_instruction(cols)


def paged(program: Program) -> Program:
    """``program`` (unpaged) as its architecture's ``prog_page`` pages it: LOADPs at the
    start of pages 1 .. N-2, the pages at the start of the external memory image, the
    streamed weights and the tensors in the external memory moved up past them."""
    cfg = program.config
    page = cfg.prog_page
    if not page:
        return program
    if any(i.op == Op.LOADP for i in program.instructions):
        raise ValueError("paged() takes an unpaged program")
    per = ext_words_per_instruction(cfg.cols)
    lengths = page_lengths(len(program.instructions), page)
    region = page_words(len(program.instructions), page, cfg.cols)
    instructions, rest = [], list(program.instructions)
    for k, length in enumerate(lengths):
        if 1 <= k < len(lengths) - 1:       # the LOADP of page k + 1
            following = lengths[k + 1] + (k + 1 < len(lengths) - 1)
            instructions.append(Instr({"op": Op.LOADP, "count": following * per,
                                       "prog_addr": ((k + 1) % 2) * page,
                                       "ext_addr": (k + 1) * page * per}, rest[0].layer))
        instructions += rest[:length]
        rest = rest[length:]
    assert not rest and all(len(instructions[k * page:(k + 1) * page]) == page
                            for k in range(len(lengths) - 1))
    out = _moved(program, instructions, region)
    out.images["ext"] = ext_pages(out) + list(program.images.get("ext", ()))
    if out.words["ext"] > cfg.ext_depth:
        raise ResourceError(f"The program's pages take {region} words of the external "
                            f"memory beside its other {out.words['ext'] - region}, but the "
                            f"{cfg.name} architecture has {cfg.ext_depth} (ext_depth)")
    return out


def unpaged(program: Program) -> Program:
    """The program :func:`paged` made ``program`` from."""
    if not program.config.prog_page:
        return program
    region = pages_words(program)
    out = _moved(program, [i for i in program.instructions if i.op != Op.LOADP], -region)
    out.images["ext"] = list(program.images["ext"][region:])
    if not out.images["ext"]:
        del out.images["ext"]
    return out


def truncated(program: Program, layer: int) -> Program:
    """The program that stops after layer ``layer`` of ``program``, whose output it then
    reads (paged again, as ``program`` is): used to measure per-layer cycles and to find the
    first layer whose output differs."""
    whole = unpaged(program)
    instructions = [i for i in whole.instructions if i.op != Op.END and i.layer <= layer]
    instructions.append(Instr({"op": Op.END}, layer))
    output = program.layers[layer].output
    return paged(replace(whole, instructions=instructions, outputs=(Port(output, output),),
                         words={**whole.words, "prog": len(instructions)}))


def pages_words(program: Program) -> int:
    """External-memory words of the pages of ``program`` (paged or not: 0)."""
    cfg = program.config
    if not cfg.prog_page:
        return 0
    return page_words(sum(i.op != Op.LOADP for i in program.instructions), cfg.prog_page,
                      cfg.cols)


def _moved(program: Program, instructions: "list[Instr]", shift: int) -> Program:
    """``program`` with ``instructions``, its layers' first and last instructions found in
    them, and its streamed weights and external tensors ``shift`` words further."""
    moved = []
    for instr in instructions:
        if instr.op in (Op.LOADX, *Op.ACTX):
            fields = {**instr.fields, "ext_addr": instr["ext_addr"] + shift}
            if instr.get("par_count"):
                fields["par_ext"] += shift
            instr = Instr(fields, instr.layer, instr.looped)
        moved.append(instr)
    layers = [replace(layer) for layer in program.layers]
    mark_layers(moved, layers)
    placements = {name: replace(p, base=p.base + shift) if p.memory == "ext" else p
                  for name, p in program.placements.items()}
    words = dict(program.words)
    words["prog"] = min(len(moved), program.config.prog_depth) if program.config.prog_page \
        else len(moved)
    if "ext" in words:
        words["ext"] += shift
    return replace(program, instructions=moved, images=dict(program.images), layers=layers,
                   placements=placements, words=words)


def ext_pages(program: Program) -> "list[int]":
    """The external-memory words of a paged program: the start of its ``ext`` image."""
    cfg = program.config
    if not cfg.prog_page:
        return []
    per, width = ext_words_per_instruction(cfg.cols), 8 * cfg.cols
    mask = (1 << width) - 1
    words = [(word >> (width * j)) & mask
             for word in encode_instructions(program, program.instructions)
             for j in range(per)]
    return words + [0] * (pages_words(program) - len(words))
