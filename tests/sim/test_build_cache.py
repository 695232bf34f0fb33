"""The build cache (``hwonnx.sim.cache``): an entry keeps the simulator binary and its sources
only, and the cache is trimmed to its size limit, the entries used longest ago first."""

import fcntl
import os
import time

import pytest

from hwonnx.config import ArchConfig
from hwonnx.sim.cache import IN_USE_SECONDS, trim_cache
from hwonnx.sim.harness import HARNESS_TOP
from hwonnx.sim.runner import rtl_build

MB = 1_000_000


def _make(path, megabytes, age_seconds, lock=True):
    """A cache entry (a folder, or a file for a ``.v``) of ``megabytes``, last used
    ``age_seconds`` ago, with its lock file unless ``lock`` is false (a stopped build)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".v":
        path.write_bytes(b"x" * int(megabytes * MB))
    else:
        path.mkdir()
        (path / "binary").write_bytes(b"x" * int(megabytes * MB))
    if lock:
        path.with_name(path.name + ".lock").touch()
    moment = time.time() - age_seconds
    os.utime(path, (moment, moment))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HWONNX_CACHE", str(tmp_path))
    monkeypatch.delenv("HWONNX_CACHE_MB", raising=False)
    return tmp_path


def test_the_entries_used_longest_ago_go_first_down_to_the_limit(cache):
    hour = IN_USE_SECONDS
    oldest = _make(cache / "rtl" / "8x8-aaaa", 2, 3 * hour)
    stopped = _make(cache / "rtl" / "8x8-aaaa.x1y2", 1, 2.5 * hour, lock=False)
    older = _make(cache / "system" / "bbbb", 2, 2 * hour)
    old = _make(cache / "rtl" / "4x4-cccc", 2, 1.5 * hour)
    in_use = _make(cache / "verilog" / "4x4-dddd.v", 2, hour / 6)
    building = _make(cache / "rtl" / "4x4-cccc.z9w8", 1, hour / 12, lock=False)
    messages = []
    removed = trim_cache(limit_mb=5, log=messages.append)
    # 10 MB: the oldest entry, the stopped build, the next oldest entry go (5 MB left); the
    # entry 1.5 h old stays (at the limit), as do the recent ones whatever the size.
    assert sorted(removed) == sorted([oldest, stopped, older])
    assert [p for p in (oldest, stopped, older, old, in_use, building) if p.exists()] == [
        old, in_use, building]
    assert (cache / "rtl" / "8x8-aaaa.lock").exists()       # locks are never removed
    assert messages == [f"Trimmed the build cache {cache}: removed 3 entries unused the "
                        f"longest, 5 MB left (limit: $HWONNX_CACHE_MB=5)"]
    assert trim_cache(limit_mb=5) == []


def test_the_limit_comes_from_the_environment(cache, monkeypatch):
    entries = [_make(cache / "rtl" / f"2x2-{n}", 1, (5 - n) * IN_USE_SECONDS) for n in range(3)]
    monkeypatch.setenv("HWONNX_CACHE_MB", "1.5")
    assert trim_cache(log=lambda message: None) == entries[:2]
    monkeypatch.setenv("HWONNX_CACHE_MB", "0")
    assert trim_cache(log=lambda message: None) == entries[2:]


def test_an_entry_another_process_is_building_stays(cache):
    entry = _make(cache / "rtl" / "2x2-busy", 3, 2 * IN_USE_SECONDS)
    with open(cache / "rtl" / "2x2-busy.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)       # as build_lock holds it (flock: per open)
        assert trim_cache(limit_mb=0) == [] and entry.exists()
    assert trim_cache(limit_mb=0, log=lambda message: None) == [entry]
    assert not entry.exists()


@pytest.mark.rtl
def test_a_verilator_build_keeps_its_binary_and_sources_only():
    """Verilator's objects and precompiled headers (about 150 MB) are not kept: the entry is
    the binary, the Verilog and the C++ main it was built from and the build log."""
    entry = rtl_build(ArchConfig())          # the default configuration: built by the suite
    files = {path.name: path.stat().st_size for path in entry.iterdir()}
    assert set(files) == {HARNESS_TOP, "accel.v", "harness.v", "main.cpp", "build.log"}
    assert sum(files.values()) < 5 * MB, files


def test_the_key_is_that_of_the_hdl_as_imported(tmp_path, monkeypatch):
    """A build's key hashes the HDL sources this process imported, not the files at the time
    of the build: an HDL file edited while a process still runs the code it imported (a
    test run beside an edit) must not file that code's Verilog under the edited source's
    key. Here the files on disk "change" after the import: the key stays."""
    import hashlib
    from pathlib import Path

    from hwonnx import hdl
    from hwonnx.sim.runner import _build_key

    before = _build_key(ArchConfig())
    on_disk = hashlib.sha256(b"".join(
        p.read_bytes() for p in sorted(Path(hdl.__file__).parent.glob("*.py")) + [
            Path(hdl.isa.__file__)])).hexdigest()
    assert hdl.SOURCE_DIGEST == on_disk          # nothing edited since this process began
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + b"# edited"
                        if self.parent == Path(hdl.__file__).parent else real(self))
    assert _build_key(ArchConfig()) == before
