"""Save and load a compiled :class:`Program` in a build folder."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..config import ArchConfig
from ..errors import ModelError
from ..hdl.top import Accelerator
from .isa import Op
from .layout import Placement
from .lower import LayerPlan, Program, encode_program
from .timing import Timing, predict

__all__ = ["save_program", "load_program", "write_hex", "listing"]


def write_hex(path: Path, words: "list[int]", width: int) -> None:
    digits = (width + 3) // 4
    Path(path).write_text("".join(f"{w & ((1 << width) - 1):0{digits}x}\n" for w in words))


def save_program(program: Program, folder: Path) -> None:
    folder = Path(folder)
    cfg = program.config
    (folder / "arch.json").write_text(cfg.to_json() + "\n")
    images = {"prog": encode_program(program), **program.images}
    timing = predict(program.instructions, cfg)
    for name, words in images.items():
        write_hex(folder / f"{name}.hex", words, Accelerator.buffer_shape(cfg, name)[1])
    doc = {
        "input_name": program.input_name, "output_name": program.output_name,
        "input_value": program.input_value, "output_value": program.output_value,
        "words": program.words,
        "layers": [asdict(layer) for layer in program.layers],
        "placements": {k: {"base": p.base, "height": p.height, "width": p.width, "cb": p.cb,
                           "shape": list(p.shape)} for k, p in program.placements.items()},
        "instructions": [{k: int(v) for k, v in i.items()}
                         | {"name": Op.NAMES[i["op"]], "predicted_dispatch": d,
                            "predicted_done": e}
                         for i, d, e in zip(program.instructions, timing.dispatch, timing.done)],
        "predicted_cycles": timing.total,
    }
    (folder / "program.json").write_text(json.dumps(doc, indent=1))
    (folder / "program.txt").write_text(listing(program, timing))
    np.savez(folder / "placements.npz",
             **{f"p{i}": p.logical for i, p in enumerate(program.placements.values())})


_SHOWN = {
    Op.LOADW: ("bank", "wgt_addr"),
    Op.MATMUL: ("bank", "wait", "first", "count", "wgt_addr", "acc_addr", "act_addr", "iy0",
                "ix0", "zp"),
    Op.POST: ("count", "acc_addr", "par_addr", "out_addr", "out_stride", "nw", "lane_off",
              "nt", "zp", "lo", "hi"),
    Op.END: (),
}


def listing(program: Program, timing: Timing) -> str:
    """Human-readable program with the predicted dispatch and completion cycle of each
    instruction."""
    lines = [f"# {len(program.instructions)} instructions, {timing.total} predicted cycles",
             "# index  dispatch  done  layer  instruction"]
    for index, (instr, dispatch, done) in enumerate(zip(program.instructions, timing.dispatch,
                                                          timing.done)):
        layer = program.layers[instr["layer"]].name
        fields = " ".join(f"{k}={instr.get(k, 0)}" for k in _SHOWN[instr["op"]])
        lines.append(f"{index:6} {dispatch:9} {done:5}  {layer}  {Op.NAMES[instr['op']]} "
                     f"{fields}")
    return "\n".join(lines) + "\n"


def load_program(folder: Path) -> Program:
    folder = Path(folder)
    try:
        cfg = ArchConfig.from_json((folder / "arch.json").read_text())
        doc = json.loads((folder / "program.json").read_text())
        with np.load(folder / "placements.npz") as npz:
            logical = [npz[f"p{i}"] for i in range(len(doc["placements"]))]
        names = ["wgt", "par"] + (["lut"] if (folder / "lut.hex").exists() else [])
        images = {name: [int(w, 16) for w in (folder / f"{name}.hex").read_text().split()]
                  for name in names}
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(f"'{folder}' is not a complete hwonnx build folder ({error}); "
                         f"run 'hwonnx build' first") from error
    placements = {k: Placement(p["base"], p["height"], p["width"], p["cb"], tuple(p["shape"]),
                               logical[i]) for i, (k, p) in enumerate(doc["placements"].items())}
    instructions = [{k: v for k, v in i.items()
                     if k not in ("name", "predicted_dispatch", "predicted_done")}
                    for i in doc["instructions"]]
    layers = [LayerPlan(**layer) for layer in doc["layers"]]
    return Program(cfg, instructions, images, layers, placements, doc["input_name"],
                   doc["output_name"], doc["input_value"], doc["output_value"], doc["words"])
