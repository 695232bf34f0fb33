"""The build folder: written whole into a temporary folder and swapped into place, locked while
it is written, and checked against its ``manifest.json`` before it is used
(``docs/build-folder.md``). What a program's files hold is :mod:`.artifact`'s."""

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from ..errors import ModelError, UsageError
from .artifact import is_int

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "SEGMENTED_FORMAT", "BUILD_NAMES", "write_manifest",
           "read_manifest", "verify_build_folder", "folder_lock", "staged_folder"]

MANIFEST = "manifest.json"
#: Version of the build-folder format (``docs/build-folder.md``); a folder of another format
#: is refused. 2: ``program.json`` lists the ``inputs`` and ``outputs``; 3: its placements
#: have a ``fill`` and ``packed``.
MANIFEST_FORMAT = 3
#: The format of a segmented build (``segments.json``, one program folder per segment); a
#: reader of format 3 alone refuses it. Unsegmented builds are format 3.
SEGMENTED_FORMAT = 4
#: The names hwonnx writes at the top of a build folder. Any file of these names (and any
#: ``.hex`` file, and anything under ``board/``) that the manifest does not list is a leftover
#: of another build, which a consistent folder does not hold.
BUILD_NAMES = frozenset({
    "arch.json", "program.json", "program.txt", "placements.npz", "prog.hex", "wgt.hex",
    "par.hex", "lut.hex", "graph.json", "graph.npz", "report.json", "report.md", "report.png",
    "accel.v",
    "board", MANIFEST, "manifest.tmp", "segments.json"})
_CHUNK = 1 << 20


def _digest(path: Path) -> "tuple[int, str]":
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _entries(folder: Path, prefix: str = ""):
    """``(relative path, os.DirEntry)`` of every entry under ``folder``, depth first, without
    following symbolic links (a link is listed, not entered)."""
    with os.scandir(folder) as scan:
        items = sorted(scan, key=lambda e: e.name)
    for entry in items:
        rel = prefix + entry.name
        yield rel, entry
        if entry.is_dir(follow_symlinks=False):
            yield from _entries(Path(entry.path), rel + "/")


def _hwonnx_version() -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version("hwonnx")
    except importlib.metadata.PackageNotFoundError:     # running from a source tree
        return "unknown"


def write_manifest(folder: Path, *, build_id: int, board: str, only=None,
                   format: int = MANIFEST_FORMAT) -> dict:
    """Write ``folder/manifest.json`` listing every file of ``folder`` (or those whose
    relative path ``only`` accepts) with its size and sha256 (written to ``manifest.tmp``,
    then renamed, so a manifest is always whole). Called last, once every other file of the
    build is written."""
    folder = Path(folder)
    files = {}
    for rel, entry in _entries(folder):
        if entry.is_symlink():          # hwonnx writes none: a bug
            raise RuntimeError(f"Build folder '{folder}' holds a symbolic link '{rel}'")
        if entry.is_file() and rel not in (MANIFEST, "manifest.tmp") \
                and (only is None or only(rel)):
            size, sha = _digest(Path(entry.path))
            files[rel] = {"size": size, "sha256": sha}
    doc = {"format": format, "hwonnx": _hwonnx_version(),
           "build_id": f"0x{build_id:08X}", "board": board, "files": files}
    partial = folder / "manifest.tmp"
    partial.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(partial, folder / MANIFEST)
    return doc


def _manifest_error(folder, why: str) -> ModelError:
    return ModelError(f"'{folder / MANIFEST}' is not a valid build manifest ({why}); rebuild "
                      f"'{folder}'")


def read_manifest(folder: Path) -> dict:
    """The manifest of build folder ``folder``, checked for structure only (see
    :func:`verify_build_folder`)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if path.is_symlink():
        raise ModelError(f"'{path}' is a symbolic link, which a build folder never holds; "
                         f"rebuild '{folder}'")
    if not path.is_file():
        if not (folder / "program.json").exists():
            raise ModelError(f"'{folder}' is not an hwonnx build folder (no program.json); run "
                             f"'hwonnx build MODEL -o {folder}' first")
        raise ModelError(f"'{folder}' is an incomplete build (no {MANIFEST}): the build was "
                         f"interrupted or not made by this hwonnx; rebuild it")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise _manifest_error(folder, str(error)) from error
    if not isinstance(doc, dict) or not is_int(doc.get("format")):
        raise _manifest_error(folder, "no format version")
    if doc["format"] not in (MANIFEST_FORMAT, SEGMENTED_FORMAT):
        raise ModelError(f"'{folder}' is a build folder of format {doc['format']} (hwonnx "
                         f"{doc.get('hwonnx', '?')}), but this hwonnx reads formats "
                         f"{MANIFEST_FORMAT} and {SEGMENTED_FORMAT}; rebuild it")
    files = doc.get("files")
    if not isinstance(files, dict) or not isinstance(doc.get("board"), str) \
            or not re.fullmatch(r"0x[0-9A-F]{8}", str(doc.get("build_id"))):
        raise _manifest_error(folder, "it needs 'files', 'build_id' and 'board'")
    for rel, entry in files.items():
        parts = Path(rel).parts
        if (Path(rel).is_absolute() or not parts or ".." in parts or rel != Path(rel).as_posix()
                or not isinstance(entry, dict) or not is_int(entry.get("size"))
                or not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256")))):
            raise _manifest_error(folder, f"bad entry {rel!r}")
    return doc


def _stale(rel: str) -> bool:
    """Whether an unlisted file ``rel`` of a build folder would be taken for part of a build:
    a name hwonnx writes, any image (``.hex``), anything under ``board/``."""
    parts = rel.split("/")
    return parts[0] in BUILD_NAMES or (len(parts) == 1 and rel.endswith(".hex")) \
        or re.fullmatch(r"segment\d+", parts[0]) is not None


def verify_build_folder(folder: Path) -> dict:
    """Check that build folder ``folder`` is the whole, unchanged output of one build, and
    return its manifest: every file the manifest lists is there, a regular file (no
    symbolic link anywhere in the folder) of the listed size and sha256, and no file that a
    build writes is there unlisted (a stale ``lut.hex`` or ``board/`` of another build).
    Files of other names (``y.npz`` written there by ``hwonnx sim --output``) are allowed.

    Raises
    ------
    ModelError
        Naming the folder or the file and what is wrong with it.
    """
    folder = Path(folder)
    doc = read_manifest(folder)
    listed = doc["files"]
    present = {}
    for rel, entry in _entries(folder):
        if entry.is_symlink():
            raise ModelError(f"'{folder / rel}' is a symbolic link, which a build folder never "
                             f"holds; rebuild '{folder}'")
        if entry.is_file():
            present[rel] = entry
        elif rel in listed:
            raise ModelError(f"'{folder / rel}' is not a regular file; rebuild '{folder}'")
    for rel, want in listed.items():
        if rel not in present:
            raise ModelError(f"'{folder}' is incomplete: '{rel}' is missing; rebuild it")
        size = present[rel].stat(follow_symlinks=False).st_size
        if size != want["size"]:
            raise ModelError(f"'{folder / rel}' has {size:,} bytes, but the build wrote "
                             f"{want['size']:,}: it was truncated or changed; rebuild "
                             f"'{folder}'")
        if _digest(folder / rel)[1] != want["sha256"]:
            raise ModelError(f"'{folder / rel}' differs from the file the build wrote (its "
                             f"sha256 does not match {MANIFEST}): it was changed after the "
                             f"build; rebuild '{folder}'")
    for rel in present:
        if rel not in listed and rel not in (MANIFEST, "manifest.tmp") and _stale(rel):
            raise ModelError(f"'{folder / rel}' is not part of this build (a leftover of "
                             f"another build?); remove it or rebuild '{folder}'")
    return doc


# Writing a build folder ----------------------------------------------------------------------

#: errno values that mean "this storage cannot take the write", whatever the file.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def _absolute(path) -> Path:
    """``path`` made absolute without resolving symbolic links (``.`` has a name then)."""
    return Path(os.path.abspath(path))


@contextlib.contextmanager
def folder_lock(folder):
    """Hold an exclusive lock on build folder ``folder`` while it is written: ``fcntl.flock``
    on ``.<name>.lock`` beside it, removed when released. A second process fails at once
    (``UsageError``) instead of waiting. Where ``flock`` is unavailable (Windows, some network
    file systems) the folder is written unlocked. Yields whether the lock is held.

    A lock file that a killed process left is taken over (a lock no process holds) and
    removed on release like any other."""
    shown, folder = folder, _absolute(folder)
    try:
        import fcntl
    except ImportError:         # not POSIX
        yield False
        return
    path = folder.with_name(f".{folder.name}.lock")
    busy = UsageError(f"'{shown}' is being written by another hwonnx process; wait for it to "
                      f"finish or choose another folder")
    for _ in range(5):
        try:
            handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise UsageError(f"Cannot create the build folder '{shown}': "
                             f"{error.strerror}") from error
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)
            raise busy from None
        except OSError:         # the file system does not lock: write unlocked
            os.close(handle)
            yield False
            return
        # The holder before this process removes the file before releasing it: a lock taken
        # on a file that is no longer at ``path`` does not count.
        try:
            current = os.stat(path)
            mine = os.fstat(handle)
            if (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(handle)
    else:
        raise busy
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)     # while still holding the lock (see above)
        os.close(handle)


def _clear_leftovers(folder: Path) -> None:
    """Remove what writers of build folder ``folder`` that were killed (``SIGKILL``, a power
    cut) left beside it: their temporary folders ``.<name>.XXXXXXXX.tmp`` and, once ``folder``
    exists, the old folders ``.<name>.XXXXXXXX.old`` of a swap (:func:`_swap`). Called with
    ``folder``'s lock held: every writer holds it while these exist, so they are a dead
    writer's. Where a swap was stopped between its two renames (``folder`` missing, one old
    folder beside it), the old folder is the previous build: it is put back."""
    name = re.escape(folder.name)
    staging = re.compile(rf"\.{name}\.[a-z0-9_]{{8}}\.tmp")
    old = re.compile(rf"\.{name}\.[0-9a-f]{{8}}\.old")
    try:
        with os.scandir(folder.parent) as scan:
            found = [(entry.name, Path(entry.path)) for entry in scan
                     if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return
    olds = [path for entry, path in found if old.fullmatch(entry)]
    if len(olds) == 1 and not folder.exists() and not folder.is_symlink():
        with contextlib.suppress(OSError):
            os.rename(olds[0], folder)
            olds = []
    for entry, path in found:
        if staging.fullmatch(entry) or (path in olds and folder.exists()):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT and SIGTERM back (they take effect afterwards) while the body runs, so
    that Ctrl-C cannot stop a swap between its two renames."""
    if threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _check_replaceable(folder: Path, shown) -> None:
    """Refuse to replace ``folder`` unless it is missing, empty or an hwonnx build folder
    holding only what builds write."""
    if folder.is_symlink():
        raise UsageError(f"The build folder '{shown}' is a symbolic link; give the folder it "
                         f"points to")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UsageError(f"Cannot create the build folder '{shown}': it is a file")
    try:
        names = sorted(os.listdir(folder))
    except OSError as error:
        raise UsageError(f"Cannot read the build folder '{shown}': {error.strerror}") from error
    if not names:
        return
    if not {MANIFEST, "program.json"} & set(names):
        raise UsageError(f"'{shown}' is not empty and is not an hwonnx build folder (it holds "
                         f"'{names[0]}'); choose another folder or empty it")
    try:
        listed = {rel.split("/")[0] for rel in read_manifest(folder)["files"]}
    except ModelError:
        listed = set()
    foreign = [name for name in names if name not in BUILD_NAMES | listed]
    if foreign:
        raise UsageError(f"'{shown}' holds '{foreign[0]}', which is not part of an hwonnx "
                         f"build; move it away before building into '{shown}'")


def _storage_error(error: OSError, staging: Path, shown) -> "UsageError | None":
    """The user error for ``error`` raised while writing ``staging`` (the temporary folder of
    ``shown``), or None if it is not a storage failure."""
    name = str(error.filename or "")
    inside = name == str(staging) or name.startswith(str(staging) + os.sep)
    if not inside and error.errno not in _STORAGE_ERRNOS:
        return None
    where = f" ({os.path.relpath(name, staging)})" if inside and name != str(staging) else ""
    return UsageError(f"Cannot write the build folder '{shown}'{where}: "
                      f"{error.strerror or error}")


@contextlib.contextmanager
def staged_folder(folder, *, copy: bool = False, check=None):
    """Write build folder ``folder`` whole, or not at all.

    Yields a temporary folder beside ``folder`` (same parent, hidden name) to write into,
    with ``folder`` locked (:func:`folder_lock`); ``copy``: start from a copy of the existing
    ``folder`` (``hwonnx bitstream`` adds to a build) instead of an empty folder, once
    ``check(folder)`` (called with the lock held) has accepted it. When the body returns, the
    temporary folder must hold a manifest (:func:`write_manifest`); it then
    replaces ``folder`` by renames (the old folder is removed only after the new one is in
    place). On any error or interruption the temporary folder is removed and ``folder`` is
    left as it was. What killed writers left beside ``folder`` goes first
    (:func:`_clear_leftovers`).

    Raises
    ------
    UsageError
        If ``folder`` cannot be created or written (naming it, and the file), is locked by
        another process, or is a non-empty folder that is not a build folder.
    """
    shown, folder = folder, _absolute(folder)
    if not folder.name:
        raise UsageError(f"Cannot create the build folder '{shown}': give a folder below it")
    if copy and not folder.is_dir():
        check(shown)            # refuses it (there is nothing to lock or copy)
    try:
        if not copy:
            folder.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        blocking = next((p for p in reversed(Path(shown).parents)
                         if p.exists() and not p.is_dir()), folder.parent)
        raise UsageError(f"Cannot create the build folder '{shown}': '{blocking}' is a "
                         f"file") from error
    except OSError as error:
        raise UsageError(f"Cannot create the build folder '{shown}': "
                         f"{error.strerror}") from error
    with folder_lock(shown) as locked:
        if locked:
            _clear_leftovers(folder)
        if copy:
            check(shown)
        else:
            _check_replaceable(folder, shown)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp",
                                            dir=folder.parent))
        except OSError as error:
            raise UsageError(f"Cannot create the build folder '{shown}': "
                             f"{error.strerror}") from error
        try:
            try:
                os.chmod(staging, 0o777 & ~_umask())   # mkdtemp's 0o700 is for secrets
                if copy:
                    shutil.copytree(folder, staging, symlinks=True, dirs_exist_ok=True)
                yield staging
                if not (staging / MANIFEST).is_file():
                    raise RuntimeError(f"The build of '{shown}' wrote no {MANIFEST}")
                _swap(staging, folder)
            except OSError as error:
                mapped = _storage_error(error, staging, shown)
                if mapped is None:
                    raise
                raise mapped from error
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _swap(staging: Path, folder: Path) -> None:
    """Put ``staging`` in the place of ``folder`` (if any), then remove the old folder."""
    with _signals_deferred():
        if not folder.exists() and not folder.is_symlink():
            os.rename(staging, folder)
            return
        old = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}.old")
        os.rename(folder, old)
        try:
            os.rename(staging, folder)
        except OSError:
            os.rename(old, folder)
            raise
        shutil.rmtree(old, ignore_errors=True)
