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

__all__ = ["save_program", "load_program", "write_hex"]


def write_hex(path: Path, words: "list[int]", width: int) -> None:
    digits = (width + 3) // 4
    Path(path).write_text("".join(f"{w & ((1 << width) - 1):0{digits}x}\n" for w in words))


def save_program(program: Program, folder: Path) -> None:
    folder = Path(folder)
    cfg = program.config
    (folder / "arch.json").write_text(cfg.to_json() + "\n")
    images = {"prog": encode_program(program), **program.images}
    for name, words in images.items():
        write_hex(folder / f"{name}.hex", words, Accelerator.buffer_shape(cfg, name)[1])
    doc = {
        "input_name": program.input_name, "output_name": program.output_name,
        "input_value": program.input_value, "output_value": program.output_value,
        "words": program.words,
        "layers": [asdict(layer) for layer in program.layers],
        "placements": {k: {"base": p.base, "height": p.height, "width": p.width, "cb": p.cb,
                           "shape": list(p.shape)} for k, p in program.placements.items()},
        "instructions": [{k: int(v) for k, v in i.items()} | {"name": Op.NAMES[i["op"]]}
                         for i in program.instructions],
    }
    (folder / "program.json").write_text(json.dumps(doc, indent=1))
    np.savez(folder / "placements.npz",
             **{f"p{i}": p.logical for i, p in enumerate(program.placements.values())})
    for name, words in program.images.items():
        np.save(folder / f"{name}.npy", np.array([str(w) for w in words]))


def load_program(folder: Path) -> Program:
    folder = Path(folder)
    try:
        cfg = ArchConfig.from_json((folder / "arch.json").read_text())
        doc = json.loads((folder / "program.json").read_text())
        with np.load(folder / "placements.npz") as npz:
            logical = [npz[f"p{i}"] for i in range(len(doc["placements"]))]
        images = {name: [int(w) for w in np.load(folder / f"{name}.npy")]
                  for name in ("wgt", "par")}
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(f"'{folder}' is not a complete hwonnx build folder ({error}); "
                         f"run 'hwonnx build' first") from error
    placements = {k: Placement(p["base"], p["height"], p["width"], p["cb"], tuple(p["shape"]),
                               logical[i]) for i, (k, p) in enumerate(doc["placements"].items())}
    instructions = [{k: v for k, v in i.items() if k != "name"} for i in doc["instructions"]]
    layers = [LayerPlan(**layer) for layer in doc["layers"]]
    return Program(cfg, instructions, images, layers, placements, doc["input_name"],
                   doc["output_name"], doc["input_value"], doc["output_value"], doc["words"])
