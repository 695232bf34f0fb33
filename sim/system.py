"""Full-system simulation: the board design (accelerator with baked-in program, UART host
bridge) on Verilator, driven over its UART pins by the host protocol client."""

import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..compiler.program import Program, encode_program
from ..errors import SimulationError, ToolchainError
from .cache import build_lock, cache_root, install_build, mark_used
from .runner import BUILD_ARGS, MAKEFLAGS, cocotb_runner, setup_verilator, toolchain_fingerprint

__all__ = ["SYSTEM_TOP", "run_system"]

SYSTEM_TOP = "hwonnx_system"


def _system_build(verilog: str, log=print) -> Path:
    setup_verilator()
    # The make flags (the model's C++ optimization) are part of the build too.
    key = hashlib.sha256((verilog + " ".join(BUILD_ARGS) + MAKEFLAGS
                          + toolchain_fingerprint()).encode()).hexdigest()[:16]
    build_dir = cache_root() / "system" / key
    # A complete build appears at once (a rename), so a binary that exists is whole.
    if (build_dir / SYSTEM_TOP).exists():
        mark_used(build_dir)
        return build_dir
    with build_lock(build_dir, "the full-system design", log=log):
        if not (build_dir / SYSTEM_TOP).exists():   # else built while this process waited
            _build_system(verilog, build_dir, log)
    return build_dir


def _build_system(verilog: str, build_dir: Path, log) -> None:
    """Build the system simulator in a temporary folder beside ``build_dir``, then rename it
    into place (called with the entry's :func:`build_lock` held)."""
    log("Building the full-system design for Verilator ...")
    started = time.monotonic()
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{build_dir.name}.", dir=build_dir.parent))
    (work / "system.v").write_text(verilog)
    (work / "public.vlt").write_text(
        "`verilator_config\n" + "".join(f'public_flat_rw -module "{SYSTEM_TOP}" -var "{p}"\n'
                                        for p in ("clk", "rst", "rx", "tx")))
    try:
        with cocotb_runner() as runner:
            runner.build(
                sources=[work / "public.vlt", work / "system.v"], hdl_toplevel=SYSTEM_TOP,
                build_dir=work / "obj", build_args=BUILD_ARGS, timescale=("1ns", "1ps"),
                log_file=work / "build.log")
    except (SystemExit, Exception) as error:
        raise ToolchainError(f"Verilator build of the system design failed; see "
                             f"'{work / 'build.log'}'") from error
    if not (work / "obj" / SYSTEM_TOP).exists():
        raise ToolchainError(f"Verilator build produced no '{work / 'obj' / SYSTEM_TOP}'")
    install_build(work, SYSTEM_TOP, ["system.v", "public.vlt", "build.log"], build_dir, log)
    log(f"Built in {time.monotonic() - started:.0f} s")


class _WithMemoryModel(wiring.Component):
    """A system top with an external memory, and the memory's deterministic model
    (``hdl/extmem.py: ExternalMemory``) on its read and write ports (the accelerator's and
    the host bridge's writes)."""

    def __init__(self, system, config):
        self._system, self._config = system, config
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        from amaranth.lib import wiring
        from ..hdl.extmem import ExternalMemory

        m = Module()
        cfg, system = self._config, self._system
        m.submodules.system = system
        m.submodules.memory = memory = ExternalMemory(cfg.ext_depth, cfg.cols * 8,
                                                      cfg.ext_timing)
        m.d.comb += [system.rx.eq(self.rx), self.tx.eq(system.tx),
                     memory.restart.eq(system.ext_restart),
                     memory.load_we.eq(0), system.ext_ready.eq(1)]
        wiring.connect(m, system.ext, memory.port)
        return m


def run_system(program: Program, inputs: "dict[str, np.ndarray]", *, divisor: int = 8,
               build_id: int, log=print) -> "tuple[dict[str, np.ndarray], list[int]]":
    """Simulate the system top of ``program`` and run the int8 ``inputs`` (input value ->
    ``[S, *shape]``, one per ``program.inputs``) over the UART. Returns the int8 outputs (output
    value -> ``[S, *shape]``) and the cycles the board reported per sample."""
    from ..hdl.convert import verilog
    from ..boards.build import board_images
    from ..boards.host import cycle_window, host_io, unpack_outputs
    from ..boards.top import SystemTop

    cfg = program.config
    top = SystemTop(cfg, board_images(program), divisor, build_id)
    if cfg.ext_memory:
        top = _WithMemoryModel(top, cfg)
    build_dir = _system_build(verilog(top, name=SYSTEM_TOP), log=log)
    in_places, reads, samples = host_io(program, {
        port.value: np.asarray(inputs[port.value], dtype=np.int8) for port in program.inputs})
    with tempfile.TemporaryDirectory(prefix="hwonnx-system-") as tmp:
        tmp = Path(tmp)
        job = {
            "config": cfg.to_json(), "divisor": divisor, "build_id": build_id,
            "in_places": in_places, "reads": reads, "cycles": cycle_window(program),
            "inputs": [[data.hex() for data in sample] for sample in samples],
            "results": str(tmp / "results.json"),
            "program": [hex(w) for w in encode_program(program)],
            "ext": [hex(w) for w in program.images.get("ext", [])],
        }
        (tmp / "job.json").write_text(json.dumps(job))
        try:
            with cocotb_runner() as runner:
                runner.test(
                    test_module="hwonnx.sim.tb_system", hdl_toplevel=SYSTEM_TOP,
                    hdl_toplevel_lang="verilog", build_dir=build_dir, test_dir=tmp,
                    results_xml=str(tmp / "results.xml"), log_file=tmp / "sim.log",
                    extra_env={"HWONNX_SYSTEM_JOB": str(tmp / "job.json"),
                               "COCOTB_LOG_LEVEL": "WARNING"})
        except (SystemExit, Exception) as error:
            raise SimulationError(f"The full-system simulation failed: {error}") from error
        if not (tmp / "results.json").exists():
            log_text = (tmp / "sim.log").read_text() if (tmp / "sim.log").exists() else ""
            raise SimulationError("The full-system simulation ended without results: "
                                  + " | ".join(log_text.strip().splitlines()[-3:]))
        result = json.loads((tmp / "results.json").read_text())
    raw = [[bytes.fromhex(text) for text in sample] for sample in result["outputs"]]
    return unpack_outputs(program, raw), result["cycles"]
