"""What simulation trusts: build-folder files checked against the manifest (a flipped word in
an image), program and architecture files checked when loaded, sample files read header
first, ``--compare`` checking cycles, a cycle limit with the accelerator's state on a
time-out, the steady simulation speed, and ``run_board`` taking one array."""

import json
import re
import shutil

import numpy as np
import pytest
from numpy.lib import format as npy_format

from hwonnx import api
from hwonnx.compiler.artifact import load_program, save_program
from hwonnx.compiler.folder import MANIFEST, write_manifest
from hwonnx.compiler.program import encode_program
from hwonnx.isa import Op
from hwonnx.errors import MismatchError, ModelError, QuantizationError, SimulationError, UsageError
from hwonnx.examples import example_path
from hwonnx.quant.data import MAX_SAMPLE_VALUES
from cli_helpers import assert_user_error, run
from helpers import quiet

MLP = str(example_path("digits_mlp"))


@pytest.fixture(scope="module")
def golden_build(digits, tmp_path_factory):
    """digits_mlp for the default 8x8 array, without Verilog; copied by each test that
    changes it."""
    out = tmp_path_factory.mktemp("sim_inputs") / "out"
    result = api.build(MLP, out, calib={"image": digits["calib"]}, verilog=False, log=quiet)
    return out, result


@pytest.fixture
def copy(golden_build, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(golden_build[0], out)
    return out


def x(digits, count=2):
    return digits["test_images"][:count]


# Build-folder files are what the build wrote -----------------------------------------------

@pytest.mark.parametrize("name", ["wgt.hex", "par.hex", "prog.hex"])
def test_a_flipped_word_in_an_image_is_refused(copy, digits, capsys, tmp_path, name):
    """A flipped bit in a weight or parameter word changed the outputs with exit status 0;
    prog.hex was not read at all (program.json was)."""
    lines = (copy / name).read_text().splitlines()
    word = int(lines[0], 16) ^ 1
    lines[0] = f"{word:0{len(lines[0])}x}"
    (copy / name).write_text("\n".join(lines) + "\n")
    np.save(tmp_path / "x.npy", x(digits))
    assert_user_error(run(capsys, "sim", copy, "--input", tmp_path / "x.npy", "--golden"),
                      re.escape(f"'{copy / name}' differs from the file the build wrote (its "
                                f"sha256 does not match manifest.json): it was changed after "
                                f"the build; rebuild '{copy}'"))


def rewrite(out, name, change):
    """Change ``name`` of build folder ``out`` and write a manifest that agrees: what a
    consistent-looking but edited folder holds (the loader must still refuse it)."""
    path = out / name
    doc = json.loads(path.read_text())
    result = change(doc)
    path.write_text(json.dumps(doc if result is None else result))
    old = json.loads((out / MANIFEST).read_text())
    write_manifest(out, build_id=int(old["build_id"], 16), board=old["board"])


def program_error(out, why):
    return re.escape(f"'{out}' is not a consistent hwonnx build folder: {why}; rebuild it")


@pytest.mark.parametrize("change, why", [
    (lambda doc: doc.update(extra=1), "program.json has unexpected key 'extra'"),
    (lambda doc: doc.pop("words") and None, "program.json has no key 'words'"),
    (lambda doc: doc["layers"][0].update(extra=1),
     "program.json: layer 0 must have the keys ext_words, first, last, macs, name, op, output, "
     "tiles, wgt_bits, wgt_words"),
    (lambda doc: doc["layers"][0].pop("name") and None,
     "program.json: layer 0 must have the keys ext_words, first, last, macs, name, op, output, "
     "tiles, wgt_bits, wgt_words"),
    (lambda doc: doc["instructions"][3].update(bogus=1),
     "program.json: instruction 3 holds 'bogus', which is not a field of SETMM"),
    (lambda doc: doc["instructions"][3].update(layer="0"),
     "program.json: instruction 3 must hold an op, its layer and instruction fields, all "
     "integers"),
    # fields of other instructions' layouts: a LOOP has no count (it took a traceback), an
    # END none of a LOADA's
    (lambda doc: doc["instructions"][2].update(count=1),
     "program.json: instruction 2 holds 'count', which is not a field of LOOP"),
    (lambda doc: doc["instructions"][6].update(fence=1, ext_addr=0),
     "program.json: instruction 6 holds 'ext_addr', 'fence', which are not fields of END"),
    (lambda doc: [1], "program.json must hold an object"),
    (lambda doc: doc.update(inputs=[]),
     "program.json: 'inputs' must list objects of a 'name' and the 'value' of a placement"),
    (lambda doc: doc["outputs"][0].update(value="nowhere"),
     "program.json: 'outputs' must list objects of a 'name' and the 'value' of a placement"),
])
def test_program_json_with_another_structure(copy, digits, change, why):
    rewrite(copy, "program.json", change)
    with pytest.raises(ModelError, match=program_error(copy, why).join("^$")):
        api.simulate(copy, x(digits), mode="golden")


def test_program_json_takes_every_field_of_the_isa(copy, digits, monkeypatch):
    """The fields an instruction of program.json may hold are its op's layout in the ISA
    (hwonnx.isa.fields_of), not a list of the loader's: a field added to the ISA is read
    without any change to the loader (LOADA's ``fence`` was refused that way, issue 36), and
    still only on the op whose layout has it."""
    from hwonnx import isa

    monkeypatch.setattr(isa, "FIELDS", isa.FIELDS + (isa.Field("spare", 1),))
    rewrite(copy, "program.json", lambda doc: doc["instructions"][3].update(spare=0))
    result = api.simulate(copy, x(digits), mode="golden")
    assert result.predicted_cycles > 0
    rewrite(copy, "program.json", lambda doc: doc["instructions"][2].update(spare=0))
    with pytest.raises(ModelError, match=program_error(
            copy, "program.json: instruction 2 holds 'spare', which is not a field of "
                  "LOOP").join("^$")):
        api.simulate(copy, x(digits), mode="golden")


@pytest.mark.parametrize("rows, cols", [(4, 4), (16, 16)])
def test_arch_json_rewritten_to_another_shape(copy, digits, rows, cols):
    rewrite(copy, "arch.json", lambda doc: doc.update(rows=rows, cols=cols))
    with pytest.raises(ModelError, match=program_error(
            copy, "arch.json differs from the architecture program.json was compiled "
                  "for").join("^$")):
        api.simulate(copy, x(digits), mode="golden")


def test_a_folder_of_an_earlier_architecture_is_refused_by_name(copy, digits):
    """A folder written before the staging buffers (its arch.json and program.json without
    stage_in_depth and stage_out_depth) is refused naming the fields, not taken for a
    changed arch.json."""
    def earlier(doc):
        del doc["stage_in_depth"], doc["stage_out_depth"]
    rewrite(copy, "arch.json", earlier)
    rewrite(copy, "program.json", lambda doc: earlier(doc["arch"]))
    with pytest.raises(ModelError, match=program_error(
            copy, "the architecture of program.json has other fields than this hwonnx's "
                  "(stage_in_depth, stage_out_depth): it was built by another "
                  "version").join("^$")):
        api.simulate(copy, x(digits), mode="golden")


def test_load_program_compares_prog_hex_with_program_json(golden_build, tmp_path):
    """Without a manifest too: load_program reads prog.hex and refuses a difference."""
    save_program(golden_build[1].program, tmp_path)
    words = (tmp_path / "prog.hex").read_text().split()
    words[1], words[2] = words[2], words[1]
    (tmp_path / "prog.hex").write_text("\n".join(words) + "\n")
    with pytest.raises(ModelError, match=program_error(
            tmp_path, "prog.hex differs from the instructions of program.json").join("^$")):
        load_program(tmp_path)


def test_load_program_ignores_a_stale_lut_hex(golden_build, tmp_path):
    """The images a program uses are listed in program.json: a lut.hex left by another build
    is not loaded (it made the RTL run fail with a ValueError traceback)."""
    program = golden_build[1].program
    save_program(program, tmp_path)
    (tmp_path / "lut.hex").write_text("00\n" * 256)
    loaded = load_program(tmp_path)
    assert sorted(loaded.images) == ["par", "wgt"]
    assert encode_program(loaded) == encode_program(program)


@pytest.mark.parametrize("name", ["graph.json", "graph.npz", "report.json"])
def test_an_unreadable_graph_or_report(copy, digits, name):
    (copy / name).write_bytes(b"PK\x03\x04 not what was written")
    old = json.loads((copy / MANIFEST).read_text())
    write_manifest(copy, build_id=int(old["build_id"], 16), board=old["board"])
    with pytest.raises(ModelError, match=r"^" + re.escape(
            f"'{copy}' is not a complete hwonnx build folder (graph or report: ") + r".+\); "
            r"rebuild it$"):
        api.simulate(copy, x(digits), mode="golden")


# Sample files -------------------------------------------------------------------------------

def test_garbage_npz(golden_build, tmp_path, capsys):
    path = tmp_path / "x.npz"
    path.write_bytes(b"PK\x03\x04" + b"garbage" * 20)
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", path, "--golden"),
                      re.escape(f"Cannot read input file '{path}': File is not a zip file"))


def test_truncated_npz(golden_build, digits, tmp_path, capsys):
    path = tmp_path / "x.npz"
    np.savez(path, image=x(digits, 20))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", path, "--golden"),
                      re.escape(f"Cannot read input file '{path}': ") + ".+")


def npy_header(path, shape, data=b""):
    with open(path, "wb") as stream:
        npy_format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False,
                                                   "shape": shape})
        stream.write(data)


def test_npy_header_beyond_the_limit(golden_build, tmp_path, capsys):
    """A header claiming 2**40 samples was allocated (a MemoryError traceback)."""
    path = tmp_path / "x.npy"
    npy_header(path, (2 ** 40, 64), np.zeros(64, np.float32).tobytes())
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", path, "--golden"),
                      re.escape(f"Input file '{path}' holds an array of shape "
                                f"({2 ** 40}, 64): more than the {MAX_SAMPLE_VALUES:,} values "
                                f"a sample file may hold"))


def test_npy_header_beyond_the_file(golden_build, tmp_path, capsys):
    path = tmp_path / "x.npy"
    npy_header(path, (1000, 64), np.zeros(64, np.float32).tobytes())
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", path, "--golden"),
                      re.escape(f"Input file '{path}' claims an array of shape (1000, 64) "
                                f"(256,000 bytes), but holds only 256 bytes of data"))


def test_npz_member_beyond_the_limit(golden_build, tmp_path, capsys):
    import zipfile

    path = tmp_path / "x.npz"
    member = tmp_path / "image.npy"
    npy_header(member, (2 ** 31, 64))
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(member, "image.npy")
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", path, "--golden"),
                      re.escape(f"Input file '{path}' (array 'image') holds an array of shape "
                                f"({2 ** 31}, 64): more than the {MAX_SAMPLE_VALUES:,} values "
                                f"a sample file may hold"))


def test_npy_of_python_objects(golden_build, tmp_path, capsys):
    path = tmp_path / "x.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", path, "--golden"),
                      re.escape(f"Input file '{path}' holds an array of Python objects, not "
                                f"numbers"))


def test_sample_files_still_load(golden_build, digits, tmp_path):
    """The header-first reader reads what np.save/np.savez write, Fortran order too."""
    images = x(digits, 5)
    np.save(tmp_path / "c.npy", images)
    np.save(tmp_path / "f.npy", np.asfortranarray(images))
    np.savez_compressed(tmp_path / "z.npz", image=images)
    want = api.simulate(golden_build[1], images, mode="golden").int_outputs
    for name in ("c.npy", "f.npy", "z.npz"):
        got = api.simulate(golden_build[0], tmp_path / name, mode="golden").int_outputs
        np.testing.assert_array_equal(got, want)


# --compare checks cycles; the cycle limit ------------------------------------------------------

def test_compare_fails_when_cycles_differ_from_the_prediction(golden_build, digits,
                                                              monkeypatch):
    """A run of 67,086 cycles against 1,550 predicted passed ``--compare``."""
    out, result = golden_build

    def slow_rtl(build_result, inputs, log=print, *, max_cycles=None):
        golden = api.run_golden(build_result, inputs)
        golden.cycles = [golden.predicted_cycles, 67_086]
        return golden
    monkeypatch.setattr("hwonnx.run.run_rtl_batch", slow_rtl)      # as simulate calls it
    predicted = api.simulate(out, x(digits), mode="golden").predicted_cycles
    with pytest.raises(MismatchError, match=re.escape(
            f"RTL cycles differ from the prediction: sample 1 took 67,086 cycles, predicted "
            f"{predicted:,}").join("^$")):
        api.simulate(out, x(digits), mode="compare")


@pytest.mark.parametrize("limit", [0, -5, 2 ** 31, 1.5, True])
def test_max_cycles_must_be_a_positive_integer(golden_build, digits, limit):
    with pytest.raises(UsageError, match=re.escape(
            f"The cycle limit (--max-cycles) must be an integer from 1 to 2,147,483,646, not "
            f"{limit!r}").join("^$")):
        api.simulate(golden_build[0], x(digits), max_cycles=limit)


def test_sim_max_cycles_option(golden_build, digits, tmp_path, capsys):
    np.save(tmp_path / "x.npy", x(digits))
    assert_user_error(run(capsys, "sim", golden_build[0], "--input", tmp_path / "x.npy",
                          "--max-cycles", "0"),
                      re.escape("The cycle limit (--max-cycles) must be an integer from 1 to "
                                "2,147,483,646, not 0"))


def test_default_cycle_limit_follows_the_prediction(golden_build):
    from hwonnx.compiler.timing import predict
    from hwonnx.sim.execute import default_max_cycles

    program = golden_build[1].program
    assert default_max_cycles(program) == \
        2 * predict(program.expanded(), program.config).total + 10_000


@pytest.fixture(scope="module")
def rtl_build(digits, tmp_path_factory):
    """digits_mlp with Verilog for the default 8x8 array (the RTL the suite already builds)."""
    out = tmp_path_factory.mktemp("sim_rtl") / "out"
    result = api.build(MLP, out, calib={"image": digits["calib"]}, log=quiet)
    return out, result


@pytest.mark.rtl
def test_a_sample_past_the_cycle_limit_stops_with_the_accelerator_state(rtl_build, digits):
    out, result = rtl_build
    program = result.program
    with pytest.raises(SimulationError) as caught:
        api.simulate(out, x(digits), mode="rtl", max_cycles=40, log=quiet)
    message = str(caught.value)
    match = re.fullmatch(r"Sample 0 did not finish within 40 cycles \(--max-cycles; it ran "
                         r"(\d+)\): (\d+) instruction\(s\) dispatched, the last (.+), the next "
                         r"(.+); busy: (.+)", message)
    assert match, message
    ran, dispatched = int(match.group(1)), int(match.group(2))
    assert 40 <= ran <= 45 and 0 < dispatched < len(program.expanded())

    def named(index):
        instr = program.expanded()[index]
        walker = ", from the tile walker" if instr.looped else ""
        return f"#{index} {Op.NAMES[instr['op']]} (layer " \
               f"'{program.layers[instr.layer].name}'{walker})"
    assert match.group(3) == named(dispatched - 1)
    assert match.group(4) == named(dispatched)
    flags = ("weight loader", "feeder", "post-processor",
             "dispatcher (its next instruction waits for an engine)")
    assert all(flag in flags for flag in match.group(5).split(", ")), match.group(5)


@pytest.mark.rtl
def test_sim_reports_steady_speed_and_start_up(rtl_build, digits, tmp_path, capsys):
    out, result = rtl_build
    np.save(tmp_path / "x.npy", x(digits))
    code, stdout, stderr = run(capsys, "sim", out, "--input", tmp_path / "x.npy", "--compare")
    assert code == 0, stderr
    assert re.fullmatch(r"2 sample\(s\) on RTL: [\d,]+ cycles per sample \(predicted [\d,]+\), "
                        r"utilization [\d.]+%, [\d.,]+( [kM])? cycles/s simulated \(excluding "
                        r"\d+\.\d s start-up\)\nRTL equals the golden model bit for bit\n",
                        stdout), stdout
    rtl = api.simulate(out, x(digits), mode="rtl", log=quiet)
    assert rtl.startup_seconds > 0
    assert rtl.steady_cycles_per_second > rtl.cycles_per_second > 0


@pytest.mark.rtl
def test_sim_max_cycles_time_out_is_one_line(rtl_build, digits, tmp_path, capsys):
    out, _ = rtl_build
    np.save(tmp_path / "x.npy", x(digits))
    assert_user_error(run(capsys, "sim", out, "--input", tmp_path / "x.npy", "--max-cycles",
                          "25"),
                      r"Sample 0 did not finish within 25 cycles \(--max-cycles; it ran \d+\): "
                      r".+; busy: .+")


# run_board takes one array, as simulate does --------------------------------------------------

def test_run_board_takes_one_array(digits, tmp_path, monkeypatch):
    from tests.boards.test_run_board import FakeBoard

    from hwonnx.boards import host
    from hwonnx.boards.build import build_id

    out = tmp_path / "out"
    result = api.build(MLP, out, board="ulx3s-85f", calib={"image": digits["calib"]},
                       verilog=False, log=quiet)
    monkeypatch.setattr(host, "SerialTransport",
                        lambda port, baud, timeout: FakeBoard(result, build_id(result.program)))
    board = api.run_board(out, "/dev/ttyFAKE", x(digits, 3), log=quiet)
    golden = api.simulate(out, x(digits, 3), mode="golden")
    np.testing.assert_array_equal(board.int_outputs, golden.int_outputs)
    with pytest.raises(UsageError, match=r"^Input data must be a dict of arrays keyed by input "
                       r"name, one NumPy array \(single-input model\) or a sample file path, "
                       r"not list$"):
        api.run_board(out, "/dev/ttyFAKE", [1, 2], log=quiet)


def test_nan_inputs_for_the_board_are_refused(digits, tmp_path):
    out = tmp_path / "out"
    api.build(MLP, out, board="ulx3s-85f", calib={"image": digits["calib"]}, verilog=False,
              log=quiet)
    bad = x(digits, 2).astype(np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(QuantizationError, match=r"^Input data for input 'image' holds NaN or "
                                                r"infinite values$"):
        api.run_board(out, "/dev/ttyFAKE", bad, log=quiet)
