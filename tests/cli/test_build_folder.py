"""The build folder is written whole or not at all, locked while it is written, and checked
against its manifest before ``sim``, ``run`` and ``bitstream`` use it (docs/build-folder.md);
failures to write it, and Ctrl-C, are one line with no partial output."""

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hwonnx import api
from hwonnx.boards.build import build_id
from hwonnx.cli import main
from hwonnx.compiler import artifact
from hwonnx.compiler import folder as build_folder
from hwonnx.compiler.folder import MANIFEST, folder_lock, verify_build_folder
from hwonnx.errors import ModelError, UsageError
from hwonnx.examples import example_path
from cli_helpers import assert_user_error, run
from helpers import quiet

MLP = str(example_path("digits_mlp"))


@pytest.fixture
def files(tmp_path, digits):
    """``calib.npy`` and ``x.npy`` in their own folder (the build folders go elsewhere)."""
    folder = tmp_path / "files"
    folder.mkdir()
    np.save(folder / "calib.npy", digits["calib"])
    np.save(folder / "x.npy", digits["test_images"][:3])
    return folder


def build(out, digits, **options):
    options.setdefault("verilog", False)
    return api.build(MLP, out, calib={"image": digits["calib"]}, log=quiet, **options)


def leftovers(parent, *keep):
    """Entries of ``parent`` other than ``keep``: temporary folders, lock files, old folders."""
    return sorted(set(os.listdir(parent)) - set(keep))


def sim_golden(capsys, out, files):
    return run(capsys, "sim", out, "--input", files / "x.npy", "--golden")


def test_a_model_given_in_memory_is_named_by_its_graph(tmp_path, digits):
    """A ``ModelProto`` passed to ``build`` is named in the report by its graph's name, not
    by the text of the whole message; a path by itself."""
    import onnx
    proto = onnx.load(MLP)
    result = api.build(proto, tmp_path / "out", calib={"image": digits["calib"]}, log=quiet,
                       verilog=False)
    name = f"in-memory model (graph '{proto.graph.name}')"
    assert proto.graph.name and result.report["model"] == name
    assert (tmp_path / "out" / "report.md").read_text().splitlines()[0] == (
        f"# hwonnx build report: {name}")
    assert build(tmp_path / "path", digits).report["model"] == MLP


# The manifest --------------------------------------------------------------------------------

def test_build_writes_a_manifest_of_every_file(tmp_path, digits):
    out = tmp_path / "out"
    result = build(out, digits, verilog=True)
    doc = json.loads((out / MANIFEST).read_text())
    assert doc["format"] == build_folder.MANIFEST_FORMAT == 3
    assert doc["hwonnx"] == build_folder._hwonnx_version()
    assert doc["build_id"] == f"0x{build_id(result.program):08X}"
    assert doc["board"] == "sim"
    names = sorted(p.name for p in out.iterdir() if p.name != MANIFEST)
    assert sorted(doc["files"]) == names
    assert "accel.v" in names and "prog.hex" in names
    for name, entry in doc["files"].items():
        data = (out / name).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert verify_build_folder(out) == doc
    assert leftovers(tmp_path, "out") == []            # no temporary folder, no lock file


def test_rebuild_replaces_the_whole_folder(tmp_path, digits, files, capsys):
    """A rebuild with another array over a 4x4 build: the new folder holds nothing of the
    old one (its Verilog for 4x4, its lut.hex)."""
    out = tmp_path / "out"
    build(out, digits, rows=4, cols=4, verilog=True)
    old_verilog = (out / "accel.v").read_text()
    (out / "lut.hex").write_text("00\n" * 4)           # as a build with tables leaves it
    build(out, digits)                                  # 8x8, no Verilog
    assert not (out / "accel.v").exists() and not (out / "lut.hex").exists()
    assert json.loads((out / "arch.json").read_text())["rows"] == 8
    assert old_verilog
    code, _, err = sim_golden(capsys, out, files)
    assert code == 0, err
    assert leftovers(tmp_path, "out", "files") == []


# Interrupted and failed builds leave the folder as it was --------------------------------------

def interrupt_verilog(monkeypatch, cache):
    """Ctrl-C while the Verilog is generated (where it was most often pressed): with an empty
    Verilog cache in ``cache``, so that it is generated."""
    import amaranth.back.verilog

    monkeypatch.setenv("HWONNX_CACHE", str(cache))

    def convert(elaboratable, *args, **kwargs):
        elaboratable._MustUse__silence = True       # it is not used: no warning about that
        raise KeyboardInterrupt
    monkeypatch.setattr(amaranth.back.verilog, "convert", convert)


def test_ctrl_c_during_a_build_is_one_line_and_leaves_nothing(tmp_path, files, monkeypatch,
                                                              capsys):
    interrupt_verilog(monkeypatch, tmp_path / "cache")
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy")
    assert (code, stdout) == (130, "")
    assert stderr.splitlines()[-1] == "hwonnx: interrupted"
    assert "Traceback" not in stderr
    assert leftovers(tmp_path, "files", "cache") == []
    assert not list((tmp_path / "cache").rglob("*.v"))     # no half-written cache entry


def test_ctrl_c_during_a_rebuild_keeps_the_old_build(tmp_path, digits, files, monkeypatch,
                                                     capsys):
    out = tmp_path / "out"
    build(out, digits, rows=4, cols=4)
    before = (out / MANIFEST).read_text()
    interrupt_verilog(monkeypatch, tmp_path / "cache")
    code, _, stderr = run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy")
    assert code == 130 and stderr.endswith("hwonnx: interrupted\n")
    assert (out / MANIFEST).read_text() == before
    verify_build_folder(out)
    assert json.loads((out / "arch.json").read_text())["rows"] == 4
    assert leftovers(tmp_path, "out", "files", "cache") == []


def killed_while_writing(out, swap=False):
    """A process killed (SIGKILL: no clean-up runs) while it writes build folder ``out``:
    during the build, or (``swap``) between the two renames that put it in place."""
    killer = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from hwonnx.compiler import folder
        if {swap!r}:        # stopped after the old folder was renamed aside
            def rename(source, target, rename=os.rename):
                rename(source, target)
                if Path(target).name.endswith(".old"):
                    os.kill(os.getpid(), signal.SIGKILL)
            folder.os.rename = rename
        with folder.staged_folder({str(out)!r}) as staging:
            (staging / "prog.hex").write_text("0\\n")
            (staging / folder.MANIFEST).write_text("{{}}")
            if not {swap!r}:
                os.kill(os.getpid(), signal.SIGKILL)
        """)
    child = subprocess.run([sys.executable, "-c", killer], capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr


def test_a_killed_build_leaves_nothing_after_the_next_build(tmp_path, files, capsys):
    """Regression: each build killed while it wrote left its hidden temporary folder (and
    lock file) beside the folder, and later builds left them there."""
    out = tmp_path / "out"
    (tmp_path / ".out.older_12.tmp").mkdir()            # an earlier killed build's
    (tmp_path / ".out.older_12.tmp" / "wgt.hex").write_text("0\n")
    (tmp_path / ".other.abcd1234.tmp").mkdir()          # another folder's: not touched
    killed_while_writing(out)
    left = leftovers(tmp_path, "files", ".other.abcd1234.tmp", ".out.older_12.tmp", ".out.lock")
    assert (tmp_path / ".out.lock").exists()
    assert len(left) == 1 and re.fullmatch(r"\.out\.[a-z0-9_]{8}\.tmp", left[0]), left
    code, _, err = run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy")
    assert code == 0, err
    assert leftovers(tmp_path, "out", "files") == [".other.abcd1234.tmp"]
    verify_build_folder(out)


def test_a_build_killed_between_its_renames_is_undone_by_the_next(tmp_path, digits, files,
                                                                  capsys):
    """Killed after the old build was renamed aside, before the new one took its place: the
    next build (here one that fails) puts the old build back."""
    out = tmp_path / "out"
    build(out, digits, rows=4, cols=4)
    before = (out / MANIFEST).read_text()
    killed_while_writing(out, swap=True)
    assert not out.exists()
    assert sorted(name[-4:] for name in leftovers(tmp_path, "files")) == [".old", ".tmp",
                                                                          "lock"]
    (files / "bad.npy").write_bytes(b"not a numpy file")
    code, _, err = run(capsys, "build", MLP, "-o", out, "--calib", files / "bad.npy")
    assert code == 2, err
    assert (out / MANIFEST).read_text() == before
    verify_build_folder(out)
    assert leftovers(tmp_path, "out", "files") == []
    # Killed after the new build took its place: the old one is removed by the next build.
    shutil.copytree(out, tmp_path / ".out.0123abcd.old")
    build(out, digits)
    assert leftovers(tmp_path, "out", "files") == []


def no_space(monkeypatch):
    """The disk fills up while wgt.hex is written: half of it is on disk."""
    write_hex = artifact.write_hex

    def full(path, words, width):
        if path.name == "wgt.hex":
            write_hex(path, words[:len(words) // 2], width)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write_hex(path, words, width)
    monkeypatch.setattr(artifact, "write_hex", full)


def test_disk_full_is_one_line_and_leaves_no_partial_build(tmp_path, files, monkeypatch,
                                                           capsys):
    no_space(monkeypatch)
    out = tmp_path / "out"
    assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                      re.escape(f"Cannot write the build folder '{out}' (wgt.hex): No space "
                                f"left on device"))
    assert leftovers(tmp_path, "files") == []


def test_disk_full_during_a_rebuild_keeps_the_old_build(tmp_path, digits, files, monkeypatch,
                                                        capsys):
    out = tmp_path / "out"
    build(out, digits)
    before = (out / MANIFEST).read_text()
    no_space(monkeypatch)
    code, _, err = run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy",
                       "--rows", "4", "--cols", "4")
    assert code == 2 and "No space left on device" in err
    assert (out / MANIFEST).read_text() == before
    verify_build_folder(out)
    assert leftovers(tmp_path, "out", "files") == []


@pytest.mark.parametrize("code, text", [(errno.EACCES, "Permission denied"),
                                        (errno.EROFS, "Read-only file system")])
def test_a_folder_that_cannot_be_written(tmp_path, files, monkeypatch, capsys, code, text):
    """Permission denied, read-only file system: as root (where chmod does not stop writes)
    the temporary folder's creation fails as it would there."""
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code), kwargs.get("dir"))
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    out = tmp_path / "out"
    assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                      re.escape(f"Cannot create the build folder '{out}': {text}"))
    assert leftovers(tmp_path, "files") == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only folders, so chmod cannot make one here; "
                    "the same error is tested for every user by "
                    "test_a_folder_that_cannot_be_written (EACCES)")
def test_a_read_only_parent_folder(tmp_path, files, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        assert_user_error(run(capsys, "build", MLP, "-o", parent / "out", "--calib",
                              files / "calib.npy"),
                          re.escape(f"Cannot create the build folder '{parent / 'out'}': "
                                    f"Permission denied"))
        assert os.listdir(parent) == []
    finally:
        parent.chmod(0o755)


def test_a_parent_that_is_a_file(tmp_path, files, capsys):
    (tmp_path / "taken").write_text("a file")
    out = tmp_path / "taken" / "out"
    assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                      re.escape(f"Cannot create the build folder '{out}': "
                                f"'{tmp_path / 'taken'}' is a file"))
    assert (tmp_path / "taken").read_text() == "a file"


# What a build replaces -----------------------------------------------------------------------

def test_refuses_to_replace_a_folder_that_is_not_a_build(tmp_path, files, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                      re.escape(f"'{out}' is not empty and is not an hwonnx build folder (it "
                                f"holds 'notes.txt'); choose another folder or empty it"))
    assert os.listdir(out) == ["notes.txt"]
    assert leftovers(tmp_path, "out", "files") == []


def test_refuses_to_replace_a_build_holding_other_files(tmp_path, digits, files, capsys):
    out = tmp_path / "out"
    build(out, digits)
    (out / "y.npz").write_bytes(b"outputs the user keeps")
    assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                      re.escape(f"'{out}' holds 'y.npz', which is not part of an hwonnx "
                                f"build; move it away before building into '{out}'"))
    assert (out / "y.npz").exists()
    verify_build_folder(out)


def test_builds_into_an_empty_folder(tmp_path, digits):
    out = tmp_path / "empty"
    out.mkdir()
    build(out, digits)
    verify_build_folder(out)


def test_a_symlink_in_the_old_build_is_not_followed(tmp_path, digits, files, capsys):
    """A report.md that links outside the folder: ``sim`` refuses the folder, and a rebuild
    replaces the link instead of writing through it."""
    out = tmp_path / "out"
    build(out, digits)
    outside = tmp_path / "files" / "precious.md"
    outside.write_text("not hwonnx's")
    (out / "report.md").unlink()
    (out / "report.md").symlink_to(outside)
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out / 'report.md'}' is a symbolic link, which a build "
                                f"folder never holds; rebuild '{out}'"))
    build(out, digits)
    assert outside.read_text() == "not hwonnx's"
    assert not (out / "report.md").is_symlink()
    verify_build_folder(out)


def test_refuses_to_build_into_a_symlink(tmp_path, digits):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UsageError, match=re.escape(
            f"The build folder '{tmp_path / 'link'}' is a symbolic link; give the folder it "
            f"points to").join("^$")):
        build(tmp_path / "link", digits)
    assert os.listdir(tmp_path / "real") == []


# Two builds at once --------------------------------------------------------------------------

def test_a_second_build_into_a_locked_folder_fails_at_once(tmp_path, files, capsys):
    out = tmp_path / "out"
    with folder_lock(out):
        assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                          re.escape(f"'{out}' is being written by another hwonnx process; "
                                    f"wait for it to finish or choose another folder"))
    assert leftovers(tmp_path, "files") == []


def test_a_build_in_another_process_holds_the_lock(tmp_path, files, capsys):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from hwonnx.compiler.folder import folder_lock
            with folder_lock({str(out)!r}):
                print("locked", flush=True)
                sys.stdin.readline()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        assert_user_error(run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy"),
                          re.escape(f"'{out}' is being written by another hwonnx process; "
                                    f"wait for it to finish or choose another folder"))
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    assert leftovers(tmp_path, "files") == []
    assert run(capsys, "build", MLP, "-o", out, "--calib", files / "calib.npy")[0] == 0


# sim, run and bitstream refuse incomplete or inconsistent folders ------------------------------

def test_sim_refuses_a_folder_without_manifest(tmp_path, digits, files, capsys):
    """What an interrupted build of an earlier hwonnx left: report.json, no manifest."""
    out = tmp_path / "out"
    build(out, digits)
    (out / MANIFEST).unlink()
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out}' is an incomplete build (no manifest.json): the build "
                                f"was interrupted or not made by this hwonnx; rebuild it"))


@pytest.mark.parametrize("name", ["accel.v", "graph.json", "graph.npz", "report.json",
                                  "program.json"])
def test_sim_refuses_a_folder_with_a_file_missing(tmp_path, digits, files, capsys, name):
    out = tmp_path / "out"
    build(out, digits, verilog=True)
    (out / name).unlink()
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out}' is incomplete: '{name}' is missing; rebuild it"))


def test_sim_refuses_a_truncated_file(tmp_path, digits, files, capsys):
    """A full disk once left accel.v truncated next to report.json."""
    out = tmp_path / "out"
    build(out, digits, verilog=True)
    size = (out / "accel.v").stat().st_size
    with open(out / "accel.v", "r+b") as stream:
        stream.truncate(size // 2)
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out / 'accel.v'}' has {size // 2:,} bytes, but the build "
                                f"wrote {size:,}: it was truncated or changed; rebuild "
                                f"'{out}'"))


@pytest.mark.parametrize("stale, text", [("lut.hex", "00\n" * 256),
                                         ("board/hwonnx_board.json", "{}")])
def test_sim_refuses_a_stale_file(tmp_path, digits, files, capsys, stale, text):
    """A table file or a board folder another build left beside this one."""
    out = tmp_path / "out"
    build(out, digits)
    (out / stale).parent.mkdir(exist_ok=True)
    (out / stale).write_text(text)
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out / stale}' is not part of this build (a leftover "
                                f"of another build?); remove it or rebuild '{out}'"))


def test_sim_allows_other_files(tmp_path, digits, files, capsys):
    """Outputs a user writes into the folder (``--output out/y.npz``) are not build files."""
    out = tmp_path / "out"
    build(out, digits)
    code, _, err = run(capsys, "sim", out, "--input", files / "x.npy", "--golden", "--output",
                       out / "y.npz")
    assert code == 0, err
    assert sim_golden(capsys, out, files)[0] == 0



def test_sim_refuses_an_unreadable_manifest(tmp_path, digits, files, capsys):
    out = tmp_path / "out"
    build(out, digits)
    (out / MANIFEST).write_text("{")
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out / MANIFEST}' is not a valid build manifest (") + ".+"
                      + re.escape(f"); rebuild '{out}'"))
    (out / MANIFEST).write_text(json.dumps({"format": 3, "build_id": "0x00000000",
                                            "board": "sim",
                                            "files": {"../x": {"size": 1, "sha256": "0" * 64}}}))
    assert_user_error(sim_golden(capsys, out, files),
                      re.escape(f"'{out / MANIFEST}' is not a valid build manifest (bad entry "
                                f"'../x'); rebuild '{out}'"))
    # folders of an hwonnx before several inputs and outputs (program.json of one each), and
    # before packed inputs (placements without a fill)
    for old in (1, 2):
        (out / MANIFEST).write_text(json.dumps({"format": old, "hwonnx": "0.1.0"}))
        assert_user_error(sim_golden(capsys, out, files),
                          re.escape(f"'{out}' is a build folder of format {old} (hwonnx "
                                    f"0.1.0), but this hwonnx reads formats 3 and 4; rebuild "
                                    f"it"))


def test_a_rebuild_for_a_board_writes_its_own_board_folder(tmp_path, digits):
    """A stale board/ kept the old build id: the rebuild's board/ is its own."""
    out = tmp_path / "out"
    first = build(out, digits, board="icebreaker")
    result = api.build(MLP, out, board="icebreaker", calib={"image": digits["calib"] * 0.5},
                       verilog=False, log=quiet)
    assert build_id(result.program) != build_id(first.program)
    info = json.loads((out / "board" / "hwonnx_board.json").read_text())
    assert info["build_id"] == build_id(result.program)
    assert json.loads((out / MANIFEST).read_text())["build_id"] == \
        f"0x{build_id(result.program):08X}"
    verify_build_folder(out)
    build(out, digits)                                  # and a sim build has no board/
    assert not (out / "board").exists()


def test_run_refuses_an_incomplete_folder(tmp_path, digits, files, capsys):
    out = tmp_path / "out"
    build(out, digits, board="icebreaker")
    (out / MANIFEST).unlink()
    assert_user_error(run(capsys, "run", out, "--port", "/dev/null", "--input",
                          files / "x.npy"),
                      re.escape(f"'{out}' is an incomplete build (no manifest.json): the build "
                                f"was interrupted or not made by this hwonnx; rebuild it"))


def test_bitstream_refuses_an_inconsistent_folder(tmp_path, digits, capsys):
    out = tmp_path / "out"
    build(out, digits, board="icebreaker")
    with open(out / "board" / "hwonnx_top.il", "a") as stream:
        stream.write("\n")
    size = (out / "board" / "hwonnx_top.il").stat().st_size
    assert_user_error(run(capsys, "bitstream", out),
                      re.escape(f"'{out / 'board/hwonnx_top.il'}' has {size:,} bytes, but the "
                                f"build wrote {size - 1:,}: it was truncated or changed; "
                                f"rebuild '{out}'"))
    assert leftovers(tmp_path, "out") == []


def test_bitstream_of_a_simulation_build(tmp_path, digits, capsys):
    out = tmp_path / "out"
    build(out, digits)
    assert_user_error(run(capsys, "bitstream", out),
                      re.escape(f"'{out}' holds no board build; run 'hwonnx build MODEL "
                                f"--board B -o {out}' first"))
    assert leftovers(tmp_path, "out") == []


def test_bitstream_of_a_missing_folder(tmp_path, capsys):
    out = tmp_path / "nowhere" / "out"
    assert_user_error(run(capsys, "bitstream", out),
                      re.escape(f"'{out}' is not an hwonnx build folder (no program.json); run "
                                f"'hwonnx build MODEL -o {out}' first"))
    assert leftovers(tmp_path) == []


def test_bitstream_adds_its_files_to_the_manifest(tmp_path, digits, monkeypatch):
    """``hwonnx bitstream OUT`` on an existing build: the bitstream and the report join the
    manifest; a file of the user's stays in the folder, unlisted."""
    from hwonnx.boards import build as board_build

    out = tmp_path / "out"
    build(out, digits, board="icebreaker")
    (out / "y.npz").write_bytes(b"the user's")
    seen = []

    def fake_bitstream(board, folder, log=print, shown=None):
        seen.append((board.name, folder != out, shown))
        (folder / "board" / "hwonnx_top.bin").write_bytes(b"\0" * 100)
        return {"board": board.name, "bitstream": str(shown / "board" / "hwonnx_top.bin")}
    monkeypatch.setattr(board_build, "build_bitstream", fake_bitstream)
    assert main(["bitstream", str(out)]) == 0
    assert seen == [("icebreaker", True, out)]
    doc = verify_build_folder(out)
    assert doc["files"]["board/hwonnx_top.bin"]["size"] == 100
    assert "y.npz" not in doc["files"] and (out / "y.npz").read_bytes() == b"the user's"
    assert json.loads((out / "report.json").read_text())["bitstream"]["bitstream"] == \
        str(out / "board" / "hwonnx_top.bin")
    assert leftovers(tmp_path, "out") == []


def test_bitstream_needing_a_vendor_tool_is_refused_before_building(tmp_path, digits):
    from hwonnx.errors import ToolchainError

    with pytest.raises(ToolchainError, match=r"^Board 'arty-a7-35' needs .+ to build a "
                       r"bitstream; build without --bitstream for its complete project$"):
        build(tmp_path / "out", digits, board="arty-a7-35", bitstream=True)
    assert leftovers(tmp_path) == []


# sim --output ------------------------------------------------------------------------------

def test_sim_output_into_a_directory(tmp_path, digits, files, capsys):
    out = tmp_path / "out"
    build(out, digits)
    (tmp_path / "y.npz").mkdir()
    assert_user_error(run(capsys, "sim", out, "--input", files / "x.npy", "--golden",
                          "--output", tmp_path / "y.npz"),
                      re.escape(f"Cannot write outputs to '{tmp_path / 'y.npz'}': Is a "
                                f"directory"))
    assert os.listdir(tmp_path / "y.npz") == []
    assert leftovers(tmp_path, "out", "files", "y.npz") == []


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                     KeyboardInterrupt()])
def test_sim_output_that_fails_halfway_leaves_no_file(tmp_path, digits, files, capsys,
                                                      monkeypatch, failure):
    out = tmp_path / "out"
    build(out, digits)
    (tmp_path / "y.npz").write_bytes(b"the previous outputs")

    def savez(stream, **arrays):
        stream.write(b"PK half an archive")
        raise failure
    monkeypatch.setattr(np, "savez", savez)
    code, stdout, stderr = run(capsys, "sim", out, "--input", files / "x.npy", "--golden",
                               "--output", tmp_path / "y.npz")
    if isinstance(failure, KeyboardInterrupt):
        assert code == 130 and stderr == "hwonnx: interrupted\n"
    else:
        assert code == 2 and stderr == (f"hwonnx: error: Cannot write outputs to "
                                        f"'{tmp_path / 'y.npz'}': No space left on device\n")
    assert (tmp_path / "y.npz").read_bytes() == b"the previous outputs"
    assert leftovers(tmp_path, "out", "files", "y.npz") == []


def test_load_build_of_a_folder_without_manifest_is_a_model_error(tmp_path, digits):
    out = tmp_path / "out"
    build(out, digits)
    (out / MANIFEST).unlink()
    with pytest.raises(ModelError, match=r"^'.+' is an incomplete build \(no manifest\.json\)"):
        api.load_build(out)
