"""gpupack checkpoint helper for trainers (Python standard library only;
torch.distributed is used when the trainer has initialised it).

Run the trainer under gpupack-ckpt: when the pod is asked to checkpoint, the
agent sends every process that handles it the checkpoint signal (SIGUSR1 by
default). The handler here only sets a flag; the loop asks should_stop() at a
step boundary, which all ranks agree on, saves, and exits 0 (the agent turns
that into its "preempted" exit code)::

    ck = gpupack_ckpt.Checkpointer("/ckpt")            # rank/world from torch.distributed
    step = ck.resume(lambda p: model.load_state_dict(torch.load(p + "/model.pt")))
    while step < total_steps:
        train_one_step(); step += 1
        if ck.should_stop() or step % 1000 == 0:
            with ck.saving(step) as p: torch.save(model.state_dict(), p + "/model.pt")
            if ck.stopping: sys.exit(0)

Layout (the Go package github.com/gpupack/gpupack/checkpoint/manifest reads
the same one)::

    <dir>/step-<12 digits>/rank-<r>/<files...>
    <dir>/step-<12 digits>/rank-<r>/gpupack-manifest.json  (version, step, rank,
                                                           worldSize, files, savedAt,
                                                           runId, [tier, node,
                                                           localWorldSize])
    <dir>/step-<12 digits>/.tmp-rank-<r>-...               (a rank's save in progress)

A rank writes only its own directory: into a temporary directory that is
fsynced, hashed (streamed, 1 MiB at a time), given its manifest and renamed
into place; a step is consistent when every rank 0..worldSize-1 has a
manifest that verifies and all of them name rank 0's worldSize, runId and jobId
(one start of the job; rank directories >= that world size, an older
larger run's, are ignored). With torch.distributed initialised, the
readers (latest_consistent, resume, load, prune) are collectives in which
each rank hashes only its own shard and reads the others' manifests. With local_dir (tiered), saves go to a node-local directory and
gpupack-ckpt uploads them; reads look at the shared directory only. The module-level save()/latest() keep the older
single-rank layout (``<dir>/step-<N>/`` with the manifest in it), which the
Go side reads as a gang of one.
"""

import contextlib
import ctypes
import datetime
import hashlib
import json
import os
import re
import secrets
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

MAX_WORLD_SIZE = 1 << 20
RANK_PREFIX = "rank-"
EXIT_PREEMPTED = 200  # gpupack-ckpt's exit code after a checkpoint (checkpoint/agent)

_STEP_RE = re.compile(r"^step-(\d{12})\Z", re.ASCII)
_RANK_RE = re.compile(r"^rank-(0|[1-9]\d{0,6})\Z", re.ASCII)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)
_HEX64_RE = re.compile(r"^[0-9a-f]{64}\Z", re.ASCII)
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z", re.ASCII)
_SAVED_AT_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})\Z", re.ASCII)
RUN_ID_ENV = "GPUPACK_RUN_ID"
LOCAL_DIR_ENV = "GPUPACK_LOCAL_CHECKPOINT_DIR"
TIER_LOCAL, TIER_SHARED = "local", "shared"


class WorldSizeMismatch(ValueError):
    """The checkpoint to resume from was written by another number of ranks."""

_requested = threading.Event()
_requested_signal = None
_owner_pid = None
_installed = ()
_at_fork_registered = False


def _handler(signum, _frame):
    global _requested_signal
    if os.getpid() != _owner_pid:
        # A forked child (DataLoader worker) inherited the handler before the
        # at-fork reset ran: it must not act on the trainer's behalf.
        return
    _requested_signal = signum
    _requested.set()


def _reset_in_child():
    # Forked children (DataLoader workers, fork-context pools) do not
    # checkpoint: ignore the checkpoint signal (the agent only signals
    # processes that handle it, so it skips them), and let SIGTERM kill them
    # as it would without the helper.
    for s in _installed:
        try:
            signal.signal(s, signal.SIG_DFL if s == signal.SIGTERM else signal.SIG_IGN)
        except (OSError, ValueError):
            pass


def install(signals=(signal.SIGUSR1, signal.SIGTERM)):
    """Make each of signals set the checkpoint flag instead of its default.

    Only this process acts on them: forked children reset them (SIGTERM to
    its default, the others to ignored).
    """
    global _owner_pid, _installed, _at_fork_registered
    _owner_pid = os.getpid()
    _installed = tuple(signals)
    for s in signals:
        signal.signal(s, _handler)
    if not _at_fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_reset_in_child)
        _at_fork_registered = True


def requested():
    """True once a checkpoint signal arrived (the loop should save, then exit)."""
    return _requested.is_set()


def requested_signal():
    """The signal number that set the flag, or None."""
    return _requested_signal


def resume_step():
    """The step to resume from (GPUPACK_RESUME_STEP), or None when unset.

    Deprecated: the value is fixed when the pod is created and may be stale
    or pruned; Checkpointer.resume() takes the step from the disk instead.

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
        # No copy: hash and write the caller's buffer as it is.
        mv = memoryview(b).cast("B")
        n = self._f.write(mv)
        n = len(mv) if n is None else n
        self.sha.update(mv[:n])
        self.size += n
        return n

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
    if not names:
        raise ValueError("save(%d): no files: refusing to commit an empty checkpoint" % step)
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
        old = _replace_dir(tmp, final)
        tmp = None
        _fsync_dir(directory)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return final
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _no_duplicate_keys(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("manifest: field %r given twice" % k)
        d[k] = v
    return d


def _parse_manifest(raw):
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8")  # strictly UTF-8 (no BOM, no UTF-16), as Go reads it
    m = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    base = {"version", "step", "files", "savedAt"}
    extra = {"rank", "worldSize", "runId", "jobId", "tier", "node", "localWorldSize"}
    if not isinstance(m, dict) or not base <= set(m) or not set(m) - base <= extra:
        raise ValueError("manifest: unexpected fields")
    if "tier" in m and m["tier"] not in (TIER_LOCAL, TIER_SHARED):
        raise ValueError("manifest: tier %r" % (m["tier"],))
    if "node" in m and not (isinstance(m["node"], str) and len(m["node"]) <= 253
                            and not any(ord(c) < 0x20 or ord(c) == 0x7f for c in m["node"])):
        raise ValueError("manifest: node %r" % (m["node"],))
    if "localWorldSize" in m:
        lw = m["localWorldSize"]
        if "worldSize" not in m or not _is_int(lw) or not _is_int(m["worldSize"]) or not 1 <= lw <= m["worldSize"]:
            raise ValueError("manifest: localWorldSize %r" % (lw,))
    if ("rank" in m) != ("worldSize" in m):
        raise ValueError("manifest: rank and worldSize come together")
    if "jobId" in m and not (isinstance(m["jobId"], str) and _RUN_ID_RE.match(m["jobId"])):
        raise ValueError("manifest: jobId %r: want 1..128 characters of [A-Za-z0-9._:-]" % (m["jobId"],))
    if "runId" in m and not (isinstance(m["runId"], str) and _RUN_ID_RE.match(m["runId"])):
        raise ValueError("manifest: runId %r: want 1..128 characters of [A-Za-z0-9._:-]" % (m["runId"],))
    if "rank" in m:
        w, r = m["worldSize"], m["rank"]
        if not _is_int(w) or not 1 <= w <= MAX_WORLD_SIZE or not _is_int(r) or not 0 <= r < w:
            raise ValueError("manifest: rank %r / worldSize %r out of range" % (r, w))
    sa = m["savedAt"]
    if not isinstance(sa, str) or not _SAVED_AT_RE.match(sa):
        raise ValueError("manifest: savedAt %r is not RFC 3339" % (sa,))
    try:
        datetime.datetime.fromisoformat(re.sub(r"\.\d+", "", sa).replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("manifest: savedAt %r is not RFC 3339" % (sa,)) from None
    if not _is_int(m["version"]) or m["version"] != VERSION:
        raise ValueError("manifest: version %r" % m["version"])
    step = m["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or step > MAX_STEP:
        raise ValueError("manifest: step %r" % step)
    if not isinstance(m["files"], list):
        raise ValueError("manifest: files is not a list")
    if not m["files"]:
        # A checkpoint of nothing: named consistent, a restart would resume
        # from it and crash-loop (Go's Parse refuses it too).
        raise ValueError("manifest: lists no files")
    seen = set()
    for f in m["files"]:
        if not isinstance(f, dict) or set(f) != {"path", "size", "sha256"}:
            raise ValueError("manifest: bad file entry")
        _validate_path(f["path"])
        if f["path"] in seen:
            raise ValueError("manifest: file %r listed twice" % f["path"])
        seen.add(f["path"])
        if not _is_int(f["size"]) or f["size"] < 0:
            raise ValueError("manifest: bad size")
        if not isinstance(f["sha256"], str) or not _HEX64_RE.match(f["sha256"]):
            raise ValueError("manifest: bad sha256")
    return m


def verify(step_dir, hash_files=True):
    """Return the manifest of a step directory (single-rank layout) or of a
    rank directory (step-<N>/rank-<r>) if every file checks out, else raise.
    hash_files=False checks the manifest and that every file it lists is a
    regular file of the listed size, without reading any (read_manifest)."""
    base = os.path.basename(step_dir)
    rm = _RANK_RE.match(base)
    if rm:
        mt = _STEP_RE.match(os.path.basename(os.path.dirname(step_dir)))
    else:
        mt = _STEP_RE.match(base)
    if not mt:
        raise ValueError("%s: not a step directory" % step_dir)
    if rm and os.path.islink(os.path.dirname(step_dir)):
        raise ValueError("%s: the step directory is a symlink" % os.path.dirname(step_dir))
    _no_symlinks(step_dir, MANIFEST)
    with open(os.path.join(step_dir, MANIFEST), "rb") as fh:
        m = _parse_manifest(fh.read())
    if m["step"] != int(mt.group(1)):
        raise ValueError("%s: manifest names step %d" % (step_dir, m["step"]))
    if rm and m.get("rank") != int(rm.group(1)):
        raise ValueError("%s: manifest names rank %r" % (step_dir, m.get("rank")))
    if not rm and "rank" in m:
        raise ValueError("%s: a rank manifest outside a rank directory" % step_dir)
    for f in m["files"]:
        _no_symlinks(step_dir, f["path"])
        if not hash_files:
            if os.stat(os.path.join(step_dir, f["path"])).st_size != f["size"]:
                raise ValueError("%s: file %r does not match the manifest" % (step_dir, f["path"]))
            continue
        h = hashlib.sha256()
        size = 0
        with open(os.path.join(step_dir, f["path"]), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        if size != f["size"] or h.hexdigest() != f["sha256"]:
            raise ValueError("%s: file %r does not match the manifest" % (step_dir, f["path"]))
    return m


def _no_symlinks(d, rel):
    """d and every component of rel below it are no symlinks, rel a regular
    file: a checkpoint is only what lies inside its own directory (Go's
    checkpoint/manifest refuses the same)."""
    import stat  # noqa: WPS433
    parts = [""] + rel.split("/")
    p = d
    for i, part in enumerate(parts):
        if part:
            p = os.path.join(p, part)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            raise ValueError("%s: is a symlink; a checkpoint must not link outside its directory" % p)
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise ValueError("%s: not a directory" % p)
        if i == len(parts) - 1 and not stat.S_ISREG(st.st_mode):
            raise ValueError("%s: not a regular file" % p)


def steps(directory):
    """Step numbers of the step directories under directory, newest first (unverified)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        mt = _STEP_RE.match(n)
        p = os.path.join(directory, n)
        if mt and os.path.isdir(p) and not os.path.islink(p):
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


# ---------------------------------------------------------------------------
# Gang-aware checkpoints: one directory per rank, a step consistent once
# every rank's manifest verifies.

def rank_dir_name(rank):
    return "%s%d" % (RANK_PREFIX, rank)


def _dist():
    """torch.distributed when it is initialised, else None."""
    try:
        import torch.distributed as dist  # noqa: WPS433 (optional dependency)
    except ImportError:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # noqa: BLE001 (a broken torch must not break saving)
        return None
    return None


def _collective_device(dist, device=None):
    """The device of the helper's small collectives: the given one; "cpu"
    for gloo (and any backend but NCCL); for NCCL this rank's GPU: the
    device the trainer selected (torch.cuda.set_device), else LOCAL_RANK's
    (torchrun sets it; current_device() is GPU 0 on every rank of a node
    that never called set_device, and NCCL refuses or hangs on that), else
    GPU 0 when the process sees one GPU."""
    if device is not None:
        return str(device)
    if dist.get_backend() != "nccl":
        return "cpu"
    import torch  # noqa: WPS433
    n = torch.cuda.device_count()
    cur = torch.cuda.current_device()
    if cur != 0 or n <= 1:
        return "cuda:%d" % cur
    lr = os.environ.get("LOCAL_RANK", "").strip()
    if lr.isdigit() and int(lr) < n:
        return "cuda:%d" % int(lr)
    return "cuda:%d" % cur


def _exchange(a, b):
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE, Linux >= 3.15).
    Raises OSError (EINVAL, ENOSYS, …) where the file system or libc
    cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(38, "renameat2 not in libc")  # ENOSYS
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "renameat2(%s, %s, RENAME_EXCHANGE): %s" % (a, b, os.strerror(e)))


_rename = os.rename  # seams for the crash tests


def _replace_dir(tmp, final):
    """Put the complete directory tmp at final. When final exists (a re-save)
    the two are swapped in one step, so final is the old checkpoint or the
    new one at every instant, across a crash too; returns the old one's new
    path (to remove), or None. Where the file system cannot swap, the old
    one is moved aside first (final absent, never torn, in between)."""
    try:
        _rename(tmp, final)
        return None
    except OSError:
        if not os.path.lexists(final):
            raise
    try:
        _exchange(tmp, final)
        return tmp
    except OSError as e:
        import errno  # noqa: WPS433
        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    old = tmp + ".old"
    _rename(final, old)
    _rename(tmp, final)
    return old


def _hash_file(path):
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        before = os.fstat(fh.fileno())
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
        os.fsync(fh.fileno())
        after = os.fstat(fh.fileno())
    if (after.st_size != size or after.st_size != before.st_size
            or after.st_mtime_ns != before.st_mtime_ns):
        # Still being written (an async checkpointer not awaited inside the
        # with block): the manifest would name bytes the file does not hold.
        raise ValueError("%s changed while it was hashed (size %d -> %d); await async savers inside "
                         "the saving() block" % (path, before.st_size, after.st_size))
    return size, h.hexdigest()


def _walk_files(root):
    """Relative slash-separated paths of the regular files under root, sorted;
    directories to fsync. Symlinks and other special files are refused: a
    checkpoint must be readable on another node."""
    files, dirs = [], [root]
    for d, subdirs, names in os.walk(root, followlinks=False):
        for sd in subdirs:
            p = os.path.join(d, sd)
            if os.path.islink(p):
                raise ValueError("checkpoint entry %r is a symlink" % os.path.relpath(p, root))
            dirs.append(p)
        for n in names:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            if rel == MANIFEST:
                raise ValueError("a checkpoint file may not be named %r" % MANIFEST)
            if os.path.islink(p) or not os.path.isfile(p):
                raise ValueError("checkpoint entry %r is not a regular file" % rel)
            _validate_path(rel)
            files.append(rel)
    return sorted(files), dirs


JOB_ID_ENV = "GPUPACK_JOB_ID"  # set by the pod webhook: <namespace>:<Kind>.<group>:<name>
JOB_UID_ENV = JOB_ID_ENV  # (the name issue 16 first shipped)


def _job_id():
    """This job's id (GPUPACK_JOB_ID) when set and well-formed, else None."""
    j = os.environ.get(JOB_ID_ENV, "").strip()
    return j if _RUN_ID_RE.match(j) else None


def _other_job(rank_dir, job):
    """The jobId rank_dir's manifest names when it is another job's than
    job (both known), else None. Parsed only, no file hashed (Go's
    manifest.OtherJob)."""
    if not job:
        return None
    try:
        with open(os.path.join(rank_dir, MANIFEST), "rb") as fh:
            m = _parse_manifest(fh.read())
    except (OSError, ValueError):
        return None
    j = m.get("jobId")
    return j if j and j != job else None


def read_manifest(step_dir):
    """The manifest of a step or rank directory, parsed and checked against
    the directory's step and rank, WITHOUT hashing any file (what every
    rank reads of the other ranks' shards). Raises like verify()."""
    return verify(step_dir, hash_files=False)


def step_state(directory, step, job_id=None, hashed=None):
    """(world_size, verified_ranks, problems) of one step, both layouts.

    job_id (default GPUPACK_JOB_ID): ranks naming another jobId are
    another job's and do not count (when both are known).

    The step's world size, run and job are rank 0's: ranks 0..worldSize-1
    must all name them (a mix of two runs, jobs or world sizes is never
    consistent);
    rank directories >= that world size are another run's leftovers (a job
    that shrank) and are ignored.

    hashed(rank) says which ranks' files to hash (default: all); the
    others' manifests are only read and checked (Checkpointer spreads the
    hashing over the ranks of a torch.distributed gang)."""
    if job_id is None:
        job_id = _job_id()
    if hashed is None:
        hashed = lambda r: True  # noqa: E731
    sd = os.path.join(directory, step_dir_name(step))
    if os.path.exists(os.path.join(sd, MANIFEST)):
        try:
            verify(sd, hash_files=hashed(0))
            return 1, {0}, []
        except (OSError, ValueError) as e:
            return 1, set(), [str(e)]
    try:
        names = os.listdir(sd)
    except OSError as e:
        return 0, set(), [str(e)]
    found, problems = {}, {}  # rank -> manifest / problem
    for n in names:
        mt = _RANK_RE.match(n)
        if not mt:
            continue
        r = int(mt.group(1))
        if os.path.islink(os.path.join(sd, n)):
            problems[r] = "%s: %s is a symlink" % (sd, n)
            continue
        if not os.path.isdir(os.path.join(sd, n)):
            continue
        try:
            m = verify(os.path.join(sd, n), hash_files=hashed(r))
        except (OSError, ValueError) as e:
            problems[r] = str(e)
            continue
        if job_id and m.get("jobId") and m["jobId"] != job_id:
            problems[r] = "%s: rank %d belongs to another job (jobId %r)" % (sd, r, m["jobId"])
            continue
        found[r] = m
    if 0 not in found:
        out = [problems[r] for r in sorted(problems)]
        if not out:
            out.append("%s: rank 0 has no verified manifest" % sd)
        worlds = {m["worldSize"] for m in found.values()}
        return (max(worlds) if worlds else 0), set(found), out
    world, run = found[0]["worldSize"], found[0].get("runId", "")
    verified, out = set(), []
    for r in range(world):
        m = found.get(r)
        if m is None:
            out.append(problems.get(r) or "%s: rank %d of %d has no verified manifest" % (sd, r, world))
            continue
        verified.add(r)  # its own shard checks out; whether it fits the step:
        if m["worldSize"] != world:
            out.append("%s: ranks disagree on worldSize [%d, %d] (rank 0 and rank %d)" % (sd, world, m["worldSize"], r))
        elif m.get("runId", "") != run:
            out.append("%s: ranks come from different runs (runId %r, %r: rank 0 and rank %d)"
                       % (sd, run, m.get("runId", ""), r))
        elif m.get("jobId", "") != found[0].get("jobId", ""):
            out.append("%s: ranks come from different jobs (jobId %r, %r: rank 0 and rank %d)"
                       % (sd, found[0].get("jobId", ""), m.get("jobId", ""), r))
        if len(out) > 8:
            break
    return world, verified, out


def _is_consistent(state):
    world, verified, problems = state
    return not problems and bool(world) and len(verified) == world


def _consistent_run(directory, step, hashed=None):
    """The runId ("" when none) of step when it is gang-consistent, else None."""
    world, verified, problems = step_state(directory, step, hashed=hashed)
    if problems or not world or len(verified) != world:
        return None
    sd = os.path.join(directory, step_dir_name(step))
    if os.path.exists(os.path.join(sd, MANIFEST)):
        return None  # the single-rank layout: no runs to mix
    try:
        with open(os.path.join(sd, rank_dir_name(0), MANIFEST), "rb") as fh:
            return _parse_manifest(fh.read()).get("runId", "")
    except (OSError, ValueError):
        return None


def consistent_steps(directory, limit=None):
    """The gang-consistent steps under directory (the newest limit of them;
    all when None), newest first. One process hashes every rank's files;
    Checkpointer spreads that over a torch.distributed gang."""
    out = []
    for s in steps(directory):
        if limit is not None and len(out) >= limit:
            break
        if _is_consistent(step_state(directory, s)):
            out.append(s)
    return out


def latest_consistent(directory):
    """The newest step whose every rank's manifest verifies, or None."""
    c = consistent_steps(directory, 1)
    return c[0] if c else None


def _gang_consistent_steps(dist, directory, limit, device=None):
    """consistent_steps(directory, limit) for a torch.distributed gang, the
    same answer on every rank, each file hashed by one rank only: rank g of
    G hashes the shards of the step's ranks r with r % G == g (its own when
    the world size is unchanged) and reads every other rank's manifest
    without hashing (that it exists, names the step, rank, worldSize,
    runId and jobId, and lists files of the right sizes); an all-reduce MIN of "my
    part verifies" decides each step, so one rank's damaged shard refuses
    the step on every rank. The candidates are rank 0's step directories,
    newest first, checked one step per collective until limit are found.
    A collective: every rank calls it at the same point."""
    import torch  # noqa: WPS433
    dev = _collective_device(dist, device)
    me, world = dist.get_rank(), dist.get_world_size()
    cand = steps(directory) if me == 0 else []
    n = torch.tensor([len(cand)], dtype=torch.int64, device=dev)
    dist.broadcast(n, src=0)
    if int(n.item()) == 0:
        return []
    t = torch.tensor(cand if me == 0 else [0] * int(n.item()), dtype=torch.int64, device=dev)
    dist.broadcast(t, src=0)
    out = []
    for s in [int(x) for x in t.tolist()]:
        if limit is not None and len(out) >= limit:
            break
        ok = _is_consistent(step_state(directory, s, hashed=lambda r: r % world == me))
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if int(flag.item()) == 1:
            out.append(s)
    return out


class Checkpointer:
    """Per-rank checkpoints of one training job under ``directory``.

    rank and world_size default to torch.distributed's (when initialised),
    else the RANK / WORLD_SIZE environment (torchrun sets them), else 0 / 1.
    The constructor installs the signal handler (install=False: don't).

    run_id names this run (this start of the job) in every manifest it
    writes, so a step whose ranks come from two runs is never consistent.
    Default: rank 0 draws one and broadcasts it (a collective: construct
    the Checkpointer at the same point on every rank, after
    init_process_group; if torch.distributed is initialised later, it
    happens at the first saving()); with one rank it is drawn locally;
    with several ranks and no torch.distributed, GPUPACK_RUN_ID (which
    must then differ per start) or none.

    device: where the helper's collectives run (default: "cpu" for gloo,
    this rank's GPU for NCCL; see _collective_device).

    local_dir (default GPUPACK_LOCAL_CHECKPOINT_DIR): tiered checkpoints.
    saving() writes to this fast node-local directory (manifest tier
    "local"); gpupack-ckpt --local-checkpoint-dir uploads each rank's shard
    to directory in the background. Everything that reads (resume, load,
    latest_consistent) reads directory only: where a restart on any node
    looks. local_world_size (default LOCAL_WORLD_SIZE, else 1): how many
    ranks write to the same local directory (one pod).
    """

    def __init__(self, directory, rank=None, world_size=None, install_handler=True,
                 signals=(signal.SIGUSR1, signal.SIGTERM), run_id=None, device=None,
                 local_dir=None, local_world_size=None):
        self.directory = directory
        self.device = device
        if local_dir is None:
            local_dir = os.environ.get(LOCAL_DIR_ENV, "").strip() or None
        if local_dir is not None and os.path.abspath(local_dir) == os.path.abspath(directory):
            raise ValueError("local_dir %r is the checkpoint directory itself" % local_dir)
        self.local_dir = local_dir
        dist = _dist()
        if rank is None:
            rank = dist.get_rank() if dist else int(os.environ.get("RANK", "0"))
        if world_size is None:
            world_size = dist.get_world_size() if dist else int(os.environ.get("WORLD_SIZE", "1"))
        if not _is_int(world_size) or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise ValueError("world size %r out of range [1, %d]" % (world_size, MAX_WORLD_SIZE))
        if not _is_int(rank) or not 0 <= rank < world_size:
            raise ValueError("rank %r out of range [0, %d)" % (rank, world_size))
        self.rank, self.world_size = rank, world_size
        if local_world_size is None:
            lws = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
            local_world_size = int(lws) if lws.isdigit() else 1
        if not _is_int(local_world_size) or not 1 <= local_world_size <= world_size:
            raise ValueError("local world size %r out of range [1, %d]" % (local_world_size, world_size))
        self.local_world_size = local_world_size
        self.stopping = False
        if run_id is not None and not (isinstance(run_id, str) and _RUN_ID_RE.match(run_id)):
            raise ValueError("run_id %r: want 1..128 characters of [A-Za-z0-9._:-]" % (run_id,))
        self.run_id = run_id
        self._ensure_run_id()
        if install_handler:
            install(signals)

    def _ensure_run_id(self):
        if self.run_id is not None:
            return
        if self.world_size == 1:
            self.run_id = "%016x" % secrets.randbits(64)
            return
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            import torch  # noqa: WPS433
            mine = secrets.randbits(62) if dist.get_rank() == 0 else 0
            t = torch.tensor([mine], dtype=torch.int64, device=_collective_device(dist, self.device))
            dist.broadcast(t, src=0)
            self.run_id = "%016x" % int(t.item())
            return
        env = os.environ.get(RUN_ID_ENV, "").strip()
        if env:
            if not _RUN_ID_RE.match(env):
                raise ValueError("%s=%r: want 1..128 characters of [A-Za-z0-9._:-]" % (RUN_ID_ENV, env))
            self.run_id = env

    # -- stopping ----------------------------------------------------------

    def should_stop(self):
        """True once any rank got the checkpoint signal, the same answer on
        every rank (an all-reduce MAX when torch.distributed is initialised),
        so all ranks save the same step and none waits in a collective for a
        rank that has left. Call it at the same point of every step on every
        rank. Stays True once it was True."""
        local = 1 if (self.stopping or requested()) else 0
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            import torch  # noqa: WPS433
            t = torch.tensor([local], dtype=torch.int32, device=_collective_device(dist, self.device))
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            local = int(t.item())
        self.stopping = self.stopping or bool(local)
        return self.stopping

    # -- paths ---------------------------------------------------------------

    def path(self, step, rank=None):
        """The directory of this (or another) rank's checkpoint of step."""
        r = self.rank if rank is None else rank
        return os.path.join(self.directory, step_dir_name(step), rank_dir_name(r))

    def local_path(self, step):
        """This rank's directory of step in the local tier (None without one)."""
        if self.local_dir is None:
            return None
        return os.path.join(self.local_dir, step_dir_name(step), rank_dir_name(self.rank))

    # -- saving --------------------------------------------------------------

    @contextlib.contextmanager
    def saving(self, step):
        """``with ck.saving(step) as path:`` write this rank's files into
        path (a fresh directory: torch.save(..., path + "/model.pt"), a DCP
        FileSystemWriter(path), save_pretrained(path)). On a clean exit the
        files are fsynced and hashed, the manifest written and the directory
        renamed to step-<N>/rank-<r>; on an exception nothing is left.

        When step is already consistent under another run (a restarted job
        re-saving the step it resumed from), the existing step is kept and
        this is a no-op (a warning on stderr): replacing one rank would mix
        two runs in that step and make it non-consistent."""
        if not _is_int(step) or not 0 <= step <= MAX_STEP:
            raise ValueError("step %r out of range [0, %d]" % (step, MAX_STEP))
        self._ensure_run_id()
        root = self.directory if self.local_dir is None else self.local_dir
        sd = os.path.join(root, step_dir_name(step))
        os.makedirs(sd, exist_ok=True)
        _fsync_dir(root)
        tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX + rank_dir_name(self.rank) + "-", dir=sd)
        try:
            yield tmp
            self._commit(step, sd, tmp)
            tmp = None
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)

    def _commit(self, step, sd, tmp):
        names, dirs = _walk_files(tmp)
        if not names:
            # Nothing written (a writer that failed silently, an async
            # saver not awaited): named consistent, the restart would
            # resume from it and crash-loop.
            raise ValueError("saving(%d): no file was written into %s; refusing to commit an empty "
                             "checkpoint (await an async saver inside the with block)" % (step, tmp))
        entries = []
        for n in names:
            size, sha = _hash_file(os.path.join(tmp, n))
            entries.append({"path": n, "size": size, "sha256": sha})
        now = datetime.datetime.now(datetime.timezone.utc)
        manifest = {
            "version": VERSION,
            "step": step,
            "files": entries,
            "savedAt": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "rank": self.rank,
            "worldSize": self.world_size,
        }
        if self.run_id is not None:
            manifest["runId"] = self.run_id
        job = _job_id()
        if job is not None:
            manifest["jobId"] = job
        if self.local_dir is not None:
            import socket  # noqa: WPS433
            manifest["tier"] = TIER_LOCAL
            manifest["node"] = (os.environ.get("NODE_NAME") or socket.gethostname())[:253]
            manifest["localWorldSize"] = self.local_world_size
        raw = (json.dumps(manifest, indent=2) + "\n").encode()
        _write_file(os.path.join(tmp, MANIFEST), raw)
        for d in dirs:
            _fsync_dir(d)
        final = os.path.join(sd, rank_dir_name(self.rank))
        other_job = _other_job(final, job)
        if other_job is not None:
            # A re-created job (a new UID), or two jobs sharing the
            # directory: never replace another job's checkpoint.
            raise ValueError("saving(%d): %s belongs to another job (jobId %r, this job's is %r); refusing "
                             "to replace it (give this job its own checkpoint directory)" % (step, final, other_job, job))
        if os.path.lexists(final):
            # Manifests only (no hashing of the other ranks' shards, this
            # is one rank's decision): a restart re-saves the step its
            # resume() just verified gang-wide.
            other = _consistent_run(os.path.dirname(sd), step, hashed=lambda r: False)
            if other is not None and other != (self.run_id or ""):
                # A later run re-saving a step an earlier run completed
                # (resumed from it, saves at the top of its loop): swapping
                # one rank would leave the step mixing two runs, no longer
                # consistent, and prune(keep=1) may already have removed
                # every older one. Keep the existing step; this save is a
                # no-op.
                shutil.rmtree(tmp, ignore_errors=True)
                _warn("step %d is already consistent under run %r; not replacing rank %d's "
                      "checkpoint with run %r's (saving() is a no-op)" % (step, other, self.rank, self.run_id))
                return final
        old = _replace_dir(tmp, final)
        _fsync_dir(sd)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def save(self, step, files):
        """Save files ({name: bytes or callable(fileobj)}) as this rank's
        checkpoint of step; the content is hashed as it is written (no copy,
        no second read). Returns the rank directory."""
        names = sorted(files)
        for n in names:
            _validate_path(n)
        with self.saving(step) as p:
            for n in names:
                os.makedirs(os.path.dirname(os.path.join(p, n)) or p, exist_ok=True)
                _write_file(os.path.join(p, n), files[n])
        return self.local_path(step) or self.path(step)

    # -- reading -------------------------------------------------------------

    def _gang(self):
        """torch.distributed when initialised with more than one rank."""
        dist = _dist()
        return dist if dist is not None and dist.get_world_size() > 1 else None

    def _consistent_steps(self, limit):
        dist = self._gang()
        if dist is None:
            return consistent_steps(self.directory, limit)
        return _gang_consistent_steps(dist, self.directory, limit, self.device)

    def latest_consistent(self):
        """The newest step every rank's manifest verifies, or None. With
        torch.distributed initialised, a collective in which each rank
        hashes only its own shard (see _gang_consistent_steps); else this
        process hashes every rank's."""
        c = self._consistent_steps(1)
        return c[0] if c else None

    def resume_step(self, on_world_change="error"):
        """The step to resume from: the newest consistent step on disk (0 when
        there is none), the same on every rank.

        GPUPACK_RESUME_STEP (the job's gpupack.io/last-consistent-checkpoint
        when the pod was created) is only a cross-check: when it differs, the
        checkpoints on disk are newer or it was pruned, so disk wins and the
        difference is reported on stderr. Ranks that see different
        directories agree on the oldest of their answers (an all-reduce MIN),
        which must then verify for this rank too.

        Raises WorldSizeMismatch when that step was written by another
        number of ranks than this job has (see resume())."""
        return max(self._agreed(on_world_change)[0], 0)

    def _agreed(self, on_world_change):
        """(step, path of the directory this rank loads), (-1, None) without
        a checkpoint."""
        if on_world_change not in ("error", "replicated"):
            raise ValueError("on_world_change %r: want 'error' or 'replicated'" % (on_world_change,))
        disk = self.latest_consistent()  # the same on every rank (a collective)
        step = -1 if disk is None else disk
        dist = _dist()
        hint = os.environ.get(RESUME_ENV, "").strip()
        if hint and not hint.isdigit():
            _warn("%s=%r is not a step; ignored" % (RESUME_ENV, hint))
        elif hint and int(hint) != step:
            _warn("%s=%s but the newest consistent checkpoint on disk is %s; using the one on disk"
                  % (RESUME_ENV, hint, "none" if step < 0 else step))
        if dist is None and self.world_size > 1:
            _warn("world size %d but torch.distributed is not initialised: ranks do not agree on the "
                  "resume step (call init_process_group before resume())" % self.world_size)
        if step < 0:
            found = steps(self.directory)
            if found:
                _warn("%d step directories under %s (newest %d) but none is consistent; starting from "
                      "scratch (see step_state(dir, step) for why)" % (len(found), self.directory, found[0]))
            return -1, None
        return step, self._source(step, on_world_change)

    def _source(self, step, on_world_change):
        """This rank's directory to load step from, checked against the world
        size the step was saved with."""
        sd = os.path.join(self.directory, step_dir_name(step))
        if os.path.exists(os.path.join(sd, MANIFEST)):
            world, src_dir = 1, lambda r: sd  # the single-rank layout
        else:
            with open(os.path.join(sd, rank_dir_name(0), MANIFEST), "rb") as fh:
                world = _parse_manifest(fh.read()).get("worldSize", 1)
            src_dir = lambda r: os.path.join(sd, rank_dir_name(r))  # noqa: E731
        if world == self.world_size:
            return src_dir(self.rank)
        if on_world_change == "replicated":
            # Every rank holds the same state (DDP): rank r of the new job
            # loads old rank r mod old world size.
            return src_dir(self.rank % world)
        raise WorldSizeMismatch(
            "checkpoint step %d under %s was saved by %d ranks, but this job has %d: a sharded "
            "state (FSDP, DCP, ZeRO) cannot be loaded rank by rank. Resume with the original world "
            "size, reshard the step offline (its rank directories: Checkpointer.paths(%d)), or pass "
            "on_world_change='replicated' if every rank holds the same state (DDP)"
            % (step, self.directory, world, self.world_size, step))

    def paths(self, step):
        """The rank directories of step, rank 0 first (for resharding)."""
        sd = os.path.join(self.directory, step_dir_name(step))
        if os.path.exists(os.path.join(sd, MANIFEST)):
            return [sd]
        world, _, _ = step_state(self.directory, step, hashed=lambda r: False)
        return [os.path.join(sd, rank_dir_name(r)) for r in range(world)]

    def resume(self, load_fn, on_world_change="error"):
        """Call load_fn(path) with this rank's directory of the step
        resume_step() picks and return that step; without a checkpoint
        return 0 and do not call load_fn.

        A step saved by another number of ranks than this job has raises
        WorldSizeMismatch (the same on every rank), instead of loading a
        shard that is not this rank's or starting over;
        on_world_change="replicated" loads old rank (rank mod old world
        size), right only when every rank's state is the same (DDP)."""
        step, p = self._agreed(on_world_change)
        if step < 0:
            return 0
        load_fn(p)
        return step

    def load(self, step=None, on_world_change="error"):
        """(step, path) of this rank's verified checkpoint of step (default:
        the newest consistent one), or (0, None) when there is none; the
        world size is checked as resume() does."""
        if step is None:
            step = self.latest_consistent()
            if step is None:
                return 0, None
        p = self._source(step, on_world_change)
        verify(p)
        return step, p

    def _owns_leftover(self, name):
        """A rank directory no rank of this world writes (rank >= world
        size: a larger, older run's) that this rank removes when pruning
        its step: rank r takes those j with j % world_size == r."""
        mt = _RANK_RE.match(name)
        return bool(mt) and int(mt.group(1)) >= self.world_size and int(mt.group(1)) % self.world_size == self.rank

    def prune(self, keep=2):
        """Remove this rank's checkpoints older than the keep newest
        consistent steps (and its own leftover temporary directories there);
        steps newer than those (a save in progress) are never touched. Each
        rank prunes its own directories (and its share of rank directories
        >= world size an older, larger run left); an emptied step directory
        goes too. With torch.distributed initialised, a collective (each
        rank hashes its own shards, see latest_consistent)."""
        keep = max(1, int(keep))
        cons = self._consistent_steps(keep)
        if len(cons) < keep:
            return []
        oldest_kept = cons[keep - 1]
        removed = []
        job = _job_id()
        own_tmp = TEMP_PREFIX + rank_dir_name(self.rank) + "-"
        # The local tier follows the shared one: a local step older than
        # the oldest consistent step kept in the shared directory is not
        # needed (it was uploaded, or a newer one superseded it).
        for root in filter(None, (self.directory, self.local_dir)):
            for s in steps(root):
                if s >= oldest_kept:
                    continue
                sd = os.path.join(root, step_dir_name(s))
                for n in os.listdir(sd):
                    if n == rank_dir_name(self.rank) or n.startswith(own_tmp) or self._owns_leftover(n):
                        other = _other_job(os.path.join(sd, n), job)
                        if other is not None:
                            _warn("prune: not removing %s: it belongs to another job (jobId %r, this job's is %r)"
                                  % (os.path.join(sd, n), other, job))
                            continue
                        shutil.rmtree(os.path.join(sd, n), ignore_errors=True)
                        removed.append(s)
                try:
                    os.rmdir(sd)
                except OSError:
                    pass  # another rank's files are still there
        return sorted(set(removed), reverse=True)


def _warn(msg):
    import sys  # noqa: WPS433
    sys.stderr.write("gpupack_ckpt: %s\n" % msg)
    sys.stderr.flush()
