"""gpupack checkpoint helper for trainers (Python standard library only).

Use it with the gpupack-ckpt wrapper: when the pod is asked to checkpoint,
the wrapper sends the trainer a signal (SIGUSR1 by default). The handler here
only sets a flag; the training loop checks it at a step boundary, saves, and
exits::

    import gpupack_ckpt as ck

    ck.install()                      # SIGUSR1 and SIGTERM set the flag
    step = ck.resume_step() or 0      # GPUPACK_RESUME_STEP, else None
    while step < total:
        train_one_step()
        step += 1
        if ck.requested() or step % 1000 == 0:
            ck.save(CKPT_DIR, step, {"model.pt": lambda f: torch.save(state, f)})
            if ck.requested():
                sys.exit(0)

The on-disk format is the one of the Go package
github.com/gpupack/gpupack/checkpoint/manifest (read its doc comment):
``<dir>/step-<12 digits>/`` holding the files and ``gpupack-manifest.json``
(version, step, files with size and sha256, savedAt). A save goes to a
temporary directory that is fsynced and renamed into place, then the parent
directory is fsynced, so a step directory is complete or absent.
"""

import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading

VERSION = 1
MANIFEST = "gpupack-manifest.json"
STEP_PREFIX = "step-"
TEMP_PREFIX = ".tmp-"
STEP_DIGITS = 12
MAX_STEP = 999_999_999_999
RESUME_ENV = "GPUPACK_RESUME_STEP"

_STEP_RE = re.compile(r"^step-(\d{12})$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")

_requested = threading.Event()
_requested_signal = None


def _handler(signum, _frame):
    global _requested_signal
    _requested_signal = signum
    _requested.set()


def install(signals=(signal.SIGUSR1, signal.SIGTERM)):
    """Make each of signals set the checkpoint flag instead of its default."""
    for s in signals:
        signal.signal(s, _handler)


def requested():
    """True once a checkpoint signal arrived (the loop should save, then exit)."""
    return _requested.is_set()


def requested_signal():
    """The signal number that set the flag, or None."""
    return _requested_signal


def resume_step():
    """The step to resume from (GPUPACK_RESUME_STEP), or None when unset.

    Raises ValueError for a value that is not a non-negative integer: a
    mistyped resume step must not silently restart from scratch.
    """
    v = os.environ.get(RESUME_ENV, "").strip()
    if not v:
        return None
    if not v.isdigit():
        raise ValueError("%s=%r is not a non-negative integer" % (RESUME_ENV, v))
    return int(v)


def step_dir_name(step):
    return "%s%0*d" % (STEP_PREFIX, STEP_DIGITS, step)


def _validate_path(p):
    if not isinstance(p, str) or p == "":
        raise ValueError("empty file name")
    if "\0" in p or "\\" in p:
        raise ValueError("file name %r: NUL and backslash are not allowed" % p)
    clean = os.path.normpath(p)
    if (p.startswith("/") or clean != p or p in (".", "..") or p.startswith("../")
            or "//" in p or p.endswith("/")):
        raise ValueError("file name %r must be a clean relative path inside the step directory" % p)
    if p == MANIFEST:
        raise ValueError("file name %r is reserved for the manifest" % p)


def _fsync_dir(d):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HashingWriter:
    """A binary file object that hashes and counts what goes through it."""

    def __init__(self, f):
        self._f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, b):
        b = bytes(b)
        n = self._f.write(b)
        self.sha.update(b)
        self.size += len(b)
        return n if n is not None else len(b)

    def flush(self):
        self._f.flush()

    def writable(self):
        return True

    def seekable(self):
        # Hashing needs a straight stream; torch.save copes with this.
        return False


def _write_file(path, content):
    with open(path, "xb") as f:
        w = _HashingWriter(f)
        if callable(content):
            content(w)
        elif isinstance(content, (bytes, bytearray, memoryview)):
            w.write(content)
        elif isinstance(content, str):
            raise TypeError("file content must be bytes or a callable(file), not str")
        else:
            raise TypeError("file content must be bytes or a callable(file), not %s" % type(content).__name__)
        f.flush()
        os.fsync(f.fileno())
    return w.size, w.sha.hexdigest()


def save(directory, step, files):
    """Write checkpoint `step` under `directory` atomically and return its path.

    files maps a relative name to bytes, or to a callable that writes the
    content into the binary file object it is given.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or step > MAX_STEP:
        raise ValueError("step %r out of range [0, %d]" % (step, MAX_STEP))
    names = sorted(files)
    for n in names:
        _validate_path(n)
    os.makedirs(directory, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX + step_dir_name(step) + "-", dir=directory)
    try:
        entries = []
        sync_dirs = {tmp}
        for n in names:
            p = os.path.join(tmp, n)
            d = os.path.dirname(p)
            if d != tmp:
                os.makedirs(d, exist_ok=True)
                while d != tmp:
                    sync_dirs.add(d)
                    d = os.path.dirname(d)
            size, sha = _write_file(p, files[n])
            entries.append({"path": n, "size": size, "sha256": sha})
        now = datetime.datetime.now(datetime.timezone.utc)
        manifest = {
            "version": VERSION,
            "step": step,
            "files": entries,
            "savedAt": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        raw = (json.dumps(manifest, indent=2) + "\n").encode()
        _write_file(os.path.join(tmp, MANIFEST), raw)
        for d in sync_dirs:
            _fsync_dir(d)
        final = os.path.join(directory, step_dir_name(step))
        old = None
        if os.path.exists(final):
            # rename cannot replace a non-empty directory: move the old step
            # aside first. Meanwhile the step is absent, never torn.
            old = tmp + ".old"
            os.rename(final, old)
        os.rename(tmp, final)
        tmp = None
        _fsync_dir(directory)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return final
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _parse_manifest(raw):
    m = json.loads(raw)
    if not isinstance(m, dict) or set(m) != {"version", "step", "files", "savedAt"}:
        raise ValueError("manifest: unexpected fields")
    if m["version"] != VERSION:
        raise ValueError("manifest: version %r" % m["version"])
    step = m["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or step > MAX_STEP:
        raise ValueError("manifest: step %r" % step)
    if not isinstance(m["files"], list):
        raise ValueError("manifest: files is not a list")
    seen = set()
    for f in m["files"]:
        if not isinstance(f, dict) or set(f) != {"path", "size", "sha256"}:
            raise ValueError("manifest: bad file entry")
        _validate_path(f["path"])
        if f["path"] in seen:
            raise ValueError("manifest: file %r listed twice" % f["path"])
        seen.add(f["path"])
        if not isinstance(f["size"], int) or f["size"] < 0:
            raise ValueError("manifest: bad size")
        if not isinstance(f["sha256"], str) or not _HEX64_RE.match(f["sha256"]):
            raise ValueError("manifest: bad sha256")
    return m


def verify(step_dir):
    """Return the manifest of step_dir if every file checks out, else raise."""
    mt = _STEP_RE.match(os.path.basename(step_dir))
    if not mt:
        raise ValueError("%s: not a step directory" % step_dir)
    with open(os.path.join(step_dir, MANIFEST), "rb") as fh:
        m = _parse_manifest(fh.read())
    if m["step"] != int(mt.group(1)):
        raise ValueError("%s: manifest names step %d" % (step_dir, m["step"]))
    for f in m["files"]:
        h = hashlib.sha256()
        size = 0
        with open(os.path.join(step_dir, f["path"]), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        if size != f["size"] or h.hexdigest() != f["sha256"]:
            raise ValueError("%s: file %r does not match the manifest" % (step_dir, f["path"]))
    return m


def steps(directory):
    """Step numbers of the step directories under directory, newest first (unverified)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        mt = _STEP_RE.match(n)
        if mt and os.path.isdir(os.path.join(directory, n)):
            out.append(int(mt.group(1)))
    return sorted(out, reverse=True)


def latest(directory):
    """The newest step under directory that verifies, or None."""
    for s in steps(directory):
        try:
            verify(os.path.join(directory, step_dir_name(s)))
            return s
        except (OSError, ValueError):
            continue
    return None


def latest_dir(directory):
    """The path of the newest verified step directory, or None."""
    s = latest(directory)
    return None if s is None else os.path.join(directory, step_dir_name(s))
