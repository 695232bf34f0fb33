"""Save and load a compiled :class:`Program` in a build folder: ``program.json``,
``program.txt``, ``placements.npz`` and the memory images (``docs/build-folder.md``). The folder
itself (manifest, lock, whole-or-nothing writing) is :mod:`.folder`'s."""

import json
import zipfile
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from ..config import ArchConfig
from ..errors import HwonnxError, ModelError
from ..isa import Op, fields_of
from .layout import Placement
from .paging import ext_pages, pages_words
from .program import Instr, LayerPlan, Port, Program, encode_program
from .timing import Timing, program_timing

__all__ = ["save_program", "load_program", "write_hex", "listing", "is_int"]


def write_hex(path: Path, words: "list[int]", width: int) -> None:
    digits = (width + 3) // 4
    if width % 8 == 0 and width <= 64 and all(0 <= w >> (width - 1) <= 1 for w in
                                              (min(words, default=0), max(words, default=0))):
        Path(path).write_bytes(_hex_lines(words, width // 8))   # (words already in width)
        return
    Path(path).write_text("".join(f"{w & ((1 << width) - 1):0{digits}x}\n" for w in words))


def _hex_lines(words: "list[int]", size: int) -> bytes:
    """``write_hex``'s text of ``words`` of ``size`` bytes each, none negative or wider, made
    on whole arrays (the ext image of ResNet-18 with an external memory: 1.5 M words)."""
    if not words:
        return b""
    data = np.array(words, dtype=np.uint64).astype(">u8").view(np.uint8).reshape(-1, 8)
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    nibbles = np.stack((data[:, 8 - size:] >> 4, data[:, 8 - size:] & 15), axis=-1)
    lines = np.empty((len(data), 2 * size + 1), dtype=np.uint8)
    lines[:, :-1] = digits[nibbles.reshape(len(data), -1)]
    lines[:, -1] = ord("\n")
    return lines.tobytes()


def save_program(program: Program, folder: Path) -> None:
    folder = Path(folder)
    cfg = program.config
    (folder / "arch.json").write_text(cfg.to_json() + "\n")
    images = {"prog": encode_program(program), **program.images}
    timing = program_timing(program)
    spans = _spans(program, timing)         # (over every issued instruction: once)
    for name, words in images.items():
        write_hex(folder / f"{name}.hex", words, cfg.buffer_shape(name)[1])
    doc = {
        "arch": cfg.to_dict(), "images": sorted(program.images),
        "inputs": [asdict(port) for port in program.inputs],
        "outputs": [asdict(port) for port in program.outputs],
        "words": program.words,
        "layers": [asdict(layer) for layer in program.layers],
        "placements": {k: {"base": p.base, "height": p.height, "width": p.width, "cb": p.cb,
                           "shape": list(p.shape), "fill": p.fill, "packed": p.packed,
                           "memory": p.memory}
                       for k, p in program.placements.items()},
        "instructions": [{k: int(v) for k, v in i.fields.items()}
                         | {"layer": i.layer, "name": Op.NAMES[i.op], "predicted_dispatch": d,
                            "predicted_done": e}
                         for i, (d, e) in zip(program.instructions, spans)],
        "predicted_cycles": timing.total,
    }
    (folder / "program.json").write_text(json.dumps(doc, indent=1))
    (folder / "program.txt").write_text(listing(program, timing, spans))
    np.savez(folder / "placements.npz",
             **{f"p{i}": p.logical for i, p in enumerate(program.placements.values())})


def _spans(program: Program, timing: Timing) -> "list[tuple[int, int]]":
    """Predicted dispatch and completion of each stored instruction; a LOOP completes with
    the last micro-instruction the walker issues for it (:attr:`Timing.spans`)."""
    return timing.spans


_SHOWN = {
    Op.SETMM: ("wgt_addr", "act_addr", "count", "iy0", "ix0", "ih", "iw", "ow", "sy", "sx",
               "zp", "dw", "wpack"),
    Op.SETPOST: ("count", "par_addr", "out_addr", "out_stride", "nw", "lane_off", "nt", "zp",
                 "lo", "hi"),
    Op.LOOP: ("m_count", "n_count", "k1", "k2", "k3"),
    Op.LOADW: ("bank", "wgt_addr", "wpack"),
    Op.MATMUL: ("bank", "wait", "first", "count", "wgt_addr", "acc_addr", "act_addr", "iy0",
                "ix0", "zp"),
    Op.POST: ("count", "acc_addr", "par_addr", "out_addr", "out_stride", "nw", "lane_off",
              "nt", "zp", "lo", "hi"),
    Op.ELTW: ("wait", "mode", "mul", "count", "acc_addr", "a_addr", "b_addr", "a_stride",
              "b_stride", "za", "zb", "ka", "kb"),
    Op.LOADX: ("count", "wgt_addr", "ext_addr", "par_count", "par_addr", "par_ext"),
    Op.LOADP: ("count", "prog_addr", "ext_addr"),
    Op.LOADA: ("fence", "count", "act_addr", "ext_addr"),
    Op.STOREA: ("fence", "count", "act_addr", "ext_addr"),
    Op.END: (),
}


def listing(program: Program, timing: Timing,
            spans: "list[tuple[int, int]] | None" = None) -> str:
    """Human-readable program with the predicted dispatch and completion cycle of each
    stored instruction (a LOOP: of its last tile; ``spans``: those cycles, when the caller
    has them from :func:`_spans`)."""
    issued = len(timing.dispatch)
    lines = [f"# {len(program.instructions)} instructions, {issued} issued with the tile "
             f"walker's, {timing.total} predicted cycles",
             "# index  dispatch  done  layer  instruction"]
    spans = _spans(program, timing) if spans is None else spans
    for index, (instr, (dispatch, done)) in enumerate(zip(program.instructions, spans)):
        layer = program.layers[instr.layer].name
        fields = " ".join(f"{k}={instr.get(k, 0)}" for k in _SHOWN[instr.op])
        lines.append(f"{index:6} {dispatch:9} {done:5}  {layer}  {Op.NAMES[instr.op]} "
                     f"{fields}")
    return "\n".join(lines) + "\n"


# Loading ---------------------------------------------------------------------------------------

_PROGRAM_KEYS = {"arch", "images", "inputs", "outputs", "words", "layers", "placements",
                 "instructions", "predicted_cycles"}
_PLACEMENT_KEYS = {"base", "height", "width", "cb", "shape", "fill", "packed"}
_LAYER_KEYS = {f.name for f in fields(LayerPlan)}
_INSTRUCTION_METADATA = ("layer", "name", "predicted_dispatch", "predicted_done")


def _instruction_keys(op: int) -> "frozenset[str]":
    """The keys an instruction of op code ``op`` may have in ``program.json``: the fields of
    its layout in the ISA (:func:`hwonnx.isa.fields_of`, the one definition the encoder and
    the HDL's decoder read too) and the metadata :func:`save_program` adds."""
    return frozenset(f.name for f in fields_of(op)) | frozenset(_INSTRUCTION_METADATA)


_LOOP_COUNTS = ("m_count", "n_count", "k1", "k2", "k3")


class _Invalid(Exception):
    """What is wrong with a file of a build folder (becomes a :class:`ModelError`)."""


def _require(condition: bool, why: str) -> None:
    if not condition:
        raise _Invalid(why)


def is_int(value) -> bool:
    """An int that is not a bool (a JSON integer)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_program_doc(doc) -> None:
    """Check the structure of ``program.json`` (every key, and the type of every value the
    loader uses), so that a changed file is an error and not a traceback."""
    _require(isinstance(doc, dict), "program.json must hold an object")
    missing, extra = _PROGRAM_KEYS - set(doc), set(doc) - _PROGRAM_KEYS
    _require(not missing, f"program.json has no key {', '.join(map(repr, sorted(missing)))}")
    _require(not extra, f"program.json has unexpected key {', '.join(map(repr, sorted(extra)))}")
    _require(isinstance(doc["arch"], dict), "program.json: 'arch' must be an object")
    _require(isinstance(doc["images"], list)
             and set(doc["images"]) <= {"wgt", "par", "lut", "ext"}
             and {"wgt", "par"} <= set(doc["images"]),
             "program.json: 'images' must list wgt, par and optionally lut and ext")
    _require(isinstance(doc["words"], dict) and all(is_int(v) for v in doc["words"].values()),
             "program.json: 'words' must map buffers to word counts")
    _require(isinstance(doc["layers"], list) and doc["layers"], "program.json: 'layers' must "
             "be a non-empty list")
    for index, layer in enumerate(doc["layers"]):
        _require(isinstance(layer, dict) and set(layer) == _LAYER_KEYS,
                 f"program.json: layer {index} must have the keys "
                 f"{', '.join(sorted(_LAYER_KEYS))}")
    _require(isinstance(doc["placements"], dict), "program.json: 'placements' must be an "
             "object")
    for name, placement in doc["placements"].items():
        _require(isinstance(placement, dict)     # "memory" is new: "act" when absent
                 and set(placement) - {"memory"} == _PLACEMENT_KEYS
                 and all(is_int(placement[k]) for k in _PLACEMENT_KEYS - {"shape", "packed"})
                 and isinstance(placement["packed"], bool)
                 and placement.get("memory", "act") in ("act", "ext")
                 and isinstance(placement["shape"], list)
                 and all(is_int(d) and d > 0 for d in placement["shape"]),
                 f"program.json: placement '{name}' must have the integer keys "
                 f"{', '.join(sorted(_PLACEMENT_KEYS - {'packed'}))}, the bool "
                 f"'packed' and the 'memory' 'act' or 'ext'")
    for key in ("inputs", "outputs"):
        _require(isinstance(doc[key], list) and doc[key] and all(
            isinstance(p, dict) and set(p) == {"name", "value"} and all(
                isinstance(v, str) for v in p.values()) and p["value"] in doc["placements"]
            for p in doc[key]), f"program.json: '{key}' must list objects of a 'name' and "
                 f"the 'value' of a placement")
    _require(isinstance(doc["instructions"], list) and doc["instructions"],
             "program.json: 'instructions' must be a non-empty list")
    for index, instr in enumerate(doc["instructions"]):
        _require(isinstance(instr, dict) and {"op", "layer"} <= set(instr)
                 and all(is_int(v) for k, v in instr.items() if k != "name")
                 and instr["op"] in Op.NAMES and 0 <= instr["layer"] < len(doc["layers"]),
                 f"program.json: instruction {index} must hold an op, its layer and "
                 f"instruction fields, all integers")
        extra = set(instr) - _instruction_keys(instr["op"])
        _require(not extra, f"program.json: instruction {index} holds "
                 f"{', '.join(map(repr, sorted(extra)))}, which "
                 f"{'are not fields' if len(extra) > 1 else 'is not a field'} of "
                 f"{Op.NAMES[instr['op']]}")
    templates = set()
    for index, instr in enumerate(doc["instructions"]):
        if instr["op"] in (Op.SETMM, Op.SETPOST):
            templates.add(instr["op"])
        _require(instr["op"] != Op.LOOP or templates == {Op.SETMM, Op.SETPOST},
                 f"program.json: LOOP instruction {index} comes before a SETMM and a SETPOST")
        _require(instr["op"] != Op.LOOP or all(instr.get(k, 0) >= 1 for k in _LOOP_COUNTS),
                 f"program.json: LOOP instruction {index} must have at least one tile per "
                 f"level ({', '.join(_LOOP_COUNTS)})")


def _read_image(path: Path, depth: int, width: int) -> "list[int]":
    try:
        words = [int(w, 16) for w in path.read_text().split()]
    except ValueError as error:
        raise _Invalid(f"{path.name} holds a word that is not hexadecimal") from error
    _require(len(words) <= depth, f"{path.name} holds {len(words)} words, but the buffer of "
             f"arch.json has {depth}")
    _require(all(0 <= w < 1 << width for w in words),
             f"{path.name} holds a word wider than the {width} bits of arch.json")
    return words


def load_program(folder: Path) -> Program:
    """Load the program :func:`save_program` wrote into ``folder``.

    Raises
    ------
    ModelError
        If a file is missing or unreadable, or the files disagree (``arch.json`` with the
        architecture the program was compiled for, ``prog.hex`` with ``program.json``).
    """
    folder = Path(folder)
    try:
        cfg = ArchConfig.from_json((folder / "arch.json").read_text())
        doc = json.loads((folder / "program.json").read_text())
        _check_program_doc(doc)
        fields = sorted(set(doc["arch"]) ^ set(cfg.to_dict()))
        _require(not fields, f"the architecture of program.json has other fields than this "
                 f"hwonnx's ({', '.join(fields)}): it was built by another version")
        _require(doc["arch"] == cfg.to_dict(), "arch.json differs from the architecture "
                 "program.json was compiled for")
        with open(folder / "placements.npz", "rb") as stream, np.load(stream) as npz:
            logical = [npz[f"p{i}"] for i in range(len(doc["placements"]))]
        images = {name: _read_image(folder / f"{name}.hex", *cfg.buffer_shape(name))
                  for name in doc["images"]}
        prog = _read_image(folder / "prog.hex", *cfg.buffer_shape("prog"))
    except _Invalid as error:
        raise ModelError(f"'{folder}' is not a consistent hwonnx build folder: {error}; "
                         f"rebuild it") from error
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
        raise ModelError(f"'{folder}' is not a complete hwonnx build folder ({error}); "
                         f"run 'hwonnx build' first") from error
    placements = {k: Placement(p["base"], p["height"], p["width"], p["cb"], tuple(p["shape"]),
                               logical[i], p["fill"], p["packed"], p.get("memory", "act"))
                  for i, (k, p) in enumerate(doc["placements"].items())}
    instructions = [Instr({k: v for k, v in i.items() if k not in _INSTRUCTION_METADATA},
                          i["layer"]) for i in doc["instructions"]]
    layers = [LayerPlan(**layer) for layer in doc["layers"]]
    program = Program(cfg, instructions, images, layers, placements,
                      tuple(Port(**p) for p in doc["inputs"]),
                      tuple(Port(**p) for p in doc["outputs"]), doc["words"])
    try:
        encoded = encode_program(program)
    except HwonnxError as error:        # a field out of its range
        raise ModelError(f"'{folder}' is not a consistent hwonnx build folder: program.json "
                         f"holds an instruction that cannot be encoded ({error}); rebuild "
                         f"it") from error
    pages = pages_words(program)
    if encoded != prog or (pages and ext_pages(program) != images.get("ext", [])[:pages]):
        what = "prog.hex differs" if encoded != prog else "the pages in ext.hex differ"
        raise ModelError(f"'{folder}' is not a consistent hwonnx build folder: {what} from "
                         f"the instructions of program.json; rebuild it")
    return program


# The build folder ------------------------------------------------------------------------------
