"""The on-disk build cache: where Verilator builds and generated Verilog are kept, the lock
that makes processes sharing it build each entry once, and the trimming that keeps it small.

An entry is kept as the simulator binary and the sources it was built from (under 1 MB for
an accelerator): Verilator's objects and precompiled headers (about 150 MB a build) are
dropped once the binary is linked. The cache holds at most ``$HWONNX_CACHE_MB`` megabytes
(default :data:`DEFAULT_LIMIT_MB`): after each new build the entries used longest ago go
first, but never one used within :data:`IN_USE_SECONDS` (a run may be about to start it)."""

import contextlib
import importlib.util
import os
import shutil
import time
from pathlib import Path

__all__ = ["cache_root", "build_lock", "install_build", "mark_used", "trim_cache",
           "DEFAULT_LIMIT_MB", "IN_USE_SECONDS"]

#: The cache's default size limit in megabytes (``$HWONNX_CACHE_MB`` sets another).
DEFAULT_LIMIT_MB = 2000
#: An entry used (built or looked up) this recently is never trimmed, nor a build folder
#: this recent (a build in progress).
IN_USE_SECONDS = 3600
#: The cache's folders whose entries are trimmed.
_KINDS = ("rtl", "system", "verilog")


def cache_root() -> Path:
    """Where RTL builds are cached: ``$HWONNX_CACHE`` or ``~/.cache/hwonnx``."""
    return Path(os.environ.get("HWONNX_CACHE", Path.home() / ".cache" / "hwonnx"))


@contextlib.contextmanager
def build_lock(build_dir: Path, what: str, log=print):
    """Hold an exclusive inter-process lock for building ``build_dir`` of the cache.

    The lock is ``fcntl.flock`` on ``<build_dir>.lock`` beside the folder (the lock file is
    never removed: removing it would let two processes lock two different files). Processes
    that share the cache (pytest-xdist workers, two test runs, a run and ``hwonnx demo``)
    therefore build each entry once: the first builds, the others wait here, then find the
    entry complete and reuse it, and no process removes a folder another is building or using.
    Where ``fcntl`` or ``flock`` is unavailable (Windows, some network file systems) the build
    runs unlocked, as before.
    """
    try:
        import fcntl
    except ImportError:         # not POSIX: no lock
        yield
        return
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(build_dir.with_name(build_dir.name + ".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            log(f"Waiting for another process to finish building {what} ({build_dir}) ...")
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            locked = True
            log(f"Waited {time.monotonic() - started:.0f} s for the build of {what}")
        except OSError:         # the file system does not lock: build unlocked
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def install_build(work: Path, binary: str, keep: "list[str]", build_dir: Path,
                  log=print) -> None:
    """Move the binary ``work/obj/<binary>`` and the files ``keep`` of ``work`` into the
    cache entry ``build_dir`` (in one rename: a binary that exists is whole), leave
    Verilator's objects behind, remove ``work`` and trim the cache. Called with the entry's
    :func:`build_lock` held."""
    entry = work / "entry"
    entry.mkdir()
    (work / "obj" / binary).rename(entry / binary)
    for name in keep:
        (work / name).rename(entry / name)
    if build_dir.exists():      # an earlier build that stopped half way (no binary)
        shutil.rmtree(build_dir)
    entry.rename(build_dir)
    shutil.rmtree(work, ignore_errors=True)
    trim_cache(log=log)


def mark_used(entry: Path) -> None:
    """Note that ``entry`` was just used, for :func:`trim_cache` (its modification time)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def trim_cache(limit_mb: "float | None" = None, log=print) -> "list[Path]":
    """Remove the cache entries used longest ago until the cache holds at most ``limit_mb``
    megabytes (default ``$HWONNX_CACHE_MB``, else :data:`DEFAULT_LIMIT_MB`), and what builds
    that were stopped left (a folder or file beside an entry, without a lock of its own).
    Nothing used or made within :data:`IN_USE_SECONDS` goes, nor an entry whose lock another
    process holds. Returns what was removed. Without ``fcntl`` (not POSIX) nothing is."""
    if importlib.util.find_spec("fcntl") is None:   # entries are told by their locks
        return []
    if limit_mb is None:
        limit_mb = float(os.environ.get("HWONNX_CACHE_MB", DEFAULT_LIMIT_MB))
    ages = {}
    for kind in _KINDS:
        folder = cache_root() / kind
        for path in folder.iterdir() if folder.is_dir() else ():
            if not path.name.endswith(".lock"):
                with contextlib.suppress(OSError):      # gone meanwhile
                    ages[path] = (time.time() - path.stat().st_mtime, _size(path))
    total, removed = sum(size for _, size in ages.values()), []
    for path, (age, size) in sorted(ages.items(), key=lambda item: -item[1][0]):
        is_entry = path.with_name(path.name + ".lock").exists()    # else a stopped build's
        if age < IN_USE_SECONDS or (is_entry and total <= limit_mb * 1e6):
            continue
        if _remove(path, locked=is_entry):
            total -= size
            removed.append(path)
    if removed:
        log(f"Trimmed the build cache {cache_root()}: removed {len(removed)} entr"
            f"{'y' if len(removed) == 1 else 'ies'} unused the longest, "
            f"{total / 1e6:,.0f} MB left (limit: $HWONNX_CACHE_MB={limit_mb:g})")
    return removed


def _remove(path: Path, locked: bool) -> bool:
    """Remove ``path``, taking its lock first if it is an entry (``locked``); an entry whose
    lock another process holds stays (False)."""
    import fcntl

    def remove():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    if not locked:
        remove()
        return True
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:         # being built, or the file system does not lock
            return False
        try:
            remove()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    return True
