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
                                                           worldSize, files, savedAt)
    <dir>/step-<12 digits>/.tmp-rank-<r>-...               (a rank's save in progress)

A rank writes only its own directory: into a temporary directory that is
fsynced, hashed (streamed, 1 MiB at a time), given its manifest and renamed
into place; a step is consistent when every rank 0..worldSize-1 has a
manifest that verifies. The module-level save()/latest() keep the older
single-rank layout (``<dir>/step-<N>/`` with the manifest in it), which the
Go side reads as a gang of one.
"""

import contextlib
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

MAX_WORLD_SIZE = 1 << 20
RANK_PREFIX = "rank-"
EXIT_PREEMPTED = 200  # gpupack-ckpt's exit code after a checkpoint (checkpoint/agent)

_STEP_RE = re.compile(r"^step-(\d{12})$")
_RANK_RE = re.compile(r"^rank-(0|[1-9]\d{0,6})$")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")

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
    base = {"version", "step", "files", "savedAt"}
    if not isinstance(m, dict) or set(m) not in (base, base | {"rank", "worldSize"}):
        raise ValueError("manifest: unexpected fields")
    if "rank" in m:
        w, r = m["worldSize"], m["rank"]
        if not _is_int(w) or not 1 <= w <= MAX_WORLD_SIZE or not _is_int(r) or not 0 <= r < w:
            raise ValueError("manifest: rank %r / worldSize %r out of range" % (r, w))
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
    """Return the manifest of a step directory (single-rank layout) or of a
    rank directory (step-<N>/rank-<r>) if every file checks out, else raise."""
    base = os.path.basename(step_dir)
    rm = _RANK_RE.match(base)
    if rm:
        mt = _STEP_RE.match(os.path.basename(os.path.dirname(step_dir)))
    else:
        mt = _STEP_RE.match(base)
    if not mt:
        raise ValueError("%s: not a step directory" % step_dir)
    with open(os.path.join(step_dir, MANIFEST), "rb") as fh:
        m = _parse_manifest(fh.read())
    if m["step"] != int(mt.group(1)):
        raise ValueError("%s: manifest names step %d" % (step_dir, m["step"]))
    if rm and m.get("rank") != int(rm.group(1)):
        raise ValueError("%s: manifest names rank %r" % (step_dir, m.get("rank")))
    if not rm and "rank" in m:
        raise ValueError("%s: a rank manifest outside a rank directory" % step_dir)
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


def _hash_file(path):
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
        os.fsync(fh.fileno())
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


def step_state(directory, step):
    """(world_size, verified_ranks, problems) of one step, both layouts."""
    sd = os.path.join(directory, step_dir_name(step))
    if os.path.exists(os.path.join(sd, MANIFEST)):
        try:
            verify(sd)
            return 1, {0}, []
        except (OSError, ValueError) as e:
            return 1, set(), [str(e)]
    try:
        names = os.listdir(sd)
    except OSError as e:
        return 0, set(), [str(e)]
    verified, worlds, problems = set(), set(), []
    for n in names:
        mt = _RANK_RE.match(n)
        if not mt or not os.path.isdir(os.path.join(sd, n)):
            continue
        try:
            m = verify(os.path.join(sd, n))
        except (OSError, ValueError) as e:
            problems.append(str(e))
            continue
        verified.add(m["rank"])
        worlds.add(m["worldSize"])
    if len(worlds) != 1:
        if len(worlds) > 1:
            problems.append("%s: ranks disagree on worldSize %s" % (sd, sorted(worlds)))
        elif not problems:
            problems.append("%s: no rank has a verified manifest" % sd)
        return (max(worlds) if worlds else 0), verified, problems
    world = worlds.pop()
    missing = [r for r in range(world) if r not in verified]
    if missing:
        problems.append("%s: ranks %s of %d have no verified manifest" % (sd, missing[:8], world))
    return world, verified, problems


def consistent_steps(directory):
    """Every gang-consistent step under directory, newest first."""
    out = []
    for s in steps(directory):
        world, verified, problems = step_state(directory, s)
        if not problems and world and len(verified) == world:
            out.append(s)
    return out


def latest_consistent(directory):
    """The newest step whose every rank's manifest verifies, or None."""
    for s in steps(directory):
        world, verified, problems = step_state(directory, s)
        if not problems and world and len(verified) == world:
            return s
    return None


class Checkpointer:
    """Per-rank checkpoints of one training job under ``directory``.

    rank and world_size default to torch.distributed's (when initialised),
    else the RANK / WORLD_SIZE environment (torchrun sets them), else 0 / 1.
    The constructor installs the signal handler (install=False: don't).
    """

    def __init__(self, directory, rank=None, world_size=None, install_handler=True,
                 signals=(signal.SIGUSR1, signal.SIGTERM)):
        self.directory = directory
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
        self.stopping = False
        if install_handler:
            install(signals)

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
            backend = dist.get_backend()
            dev = "cpu"
            if backend == "nccl":
                dev = "cuda:%d" % torch.cuda.current_device()
            t = torch.tensor([local], dtype=torch.int32, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            local = int(t.item())
        self.stopping = self.stopping or bool(local)
        return self.stopping

    # -- paths ---------------------------------------------------------------

    def path(self, step, rank=None):
        """The directory of this (or another) rank's checkpoint of step."""
        r = self.rank if rank is None else rank
        return os.path.join(self.directory, step_dir_name(step), rank_dir_name(r))

    # -- saving --------------------------------------------------------------

    @contextlib.contextmanager
    def saving(self, step):
        """``with ck.saving(step) as path:`` write this rank's files into
        path (a fresh directory: torch.save(..., path + "/model.pt"), a DCP
        FileSystemWriter(path), save_pretrained(path)). On a clean exit the
        files are fsynced and hashed, the manifest written and the directory
        renamed to step-<N>/rank-<r>; on an exception nothing is left."""
        if not _is_int(step) or not 0 <= step <= MAX_STEP:
            raise ValueError("step %r out of range [0, %d]" % (step, MAX_STEP))
        sd = os.path.join(self.directory, step_dir_name(step))
        os.makedirs(sd, exist_ok=True)
        _fsync_dir(self.directory)
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
        raw = (json.dumps(manifest, indent=2) + "\n").encode()
        _write_file(os.path.join(tmp, MANIFEST), raw)
        for d in dirs:
            _fsync_dir(d)
        final = os.path.join(sd, rank_dir_name(self.rank))
        old = None
        if os.path.exists(final):
            old = tmp + ".old"
            os.rename(final, old)
        os.rename(tmp, final)
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
        return self.path(step)

    # -- reading -------------------------------------------------------------

    def latest_consistent(self):
        """The newest step every rank's manifest verifies, or None."""
        return latest_consistent(self.directory)

    def resume_step(self):
        """The step to resume from: the newest consistent step on disk (0 when
        there is none), the same on every rank.

        GPUPACK_RESUME_STEP (the job's gpupack.io/last-consistent-checkpoint
        when the pod was created) is only a cross-check: when it differs, the
        checkpoints on disk are newer or it was pruned, so disk wins and the
        difference is reported on stderr. Ranks that see different
        directories agree on the oldest of their answers (an all-reduce MIN),
        which must then verify for this rank too."""
        return max(self._agreed_step(), 0)

    def _agreed_step(self):
        disk = self.latest_consistent()
        step = -1 if disk is None else disk
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            import torch  # noqa: WPS433
            dev = "cpu"
            if dist.get_backend() == "nccl":
                dev = "cuda:%d" % torch.cuda.current_device()
            t = torch.tensor([step], dtype=torch.int64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            step = int(t.item())
        hint = os.environ.get(RESUME_ENV, "").strip()
        if hint and not hint.isdigit():
            _warn("%s=%r is not a step; ignored" % (RESUME_ENV, hint))
        elif hint and int(hint) != step:
            _warn("%s=%s but the newest consistent checkpoint on disk is %s; using the one on disk"
                  % (RESUME_ENV, hint, "none" if step < 0 else step))
        if step >= 0 and step != disk:
            verify(self.path(step))  # the gang's choice must exist here too
        return step

    def resume(self, load_fn):
        """Call load_fn(path) with this rank's directory of the step
        resume_step() picks and return that step; without a checkpoint
        return 0 and do not call load_fn."""
        step = self._agreed_step()
        if step < 0:
            return 0
        load_fn(self.path(step))
        return step

    def load(self, step=None):
        """(step, path) of this rank's verified checkpoint of step (default:
        resume_step()), or (0, None) when there is none."""
        if step is None:
            step = self.latest_consistent()
            if step is None:
                return 0, None
        p = self.path(step)
        verify(p)
        return step, p

    def prune(self, keep=2):
        """Remove this rank's checkpoints older than the keep newest
        consistent steps (and its own leftover temporary directories there);
        steps newer than those (a save in progress) are never touched. Each
        rank prunes its own directories; an emptied step directory goes too."""
        keep = max(1, int(keep))
        cons = consistent_steps(self.directory)
        if len(cons) < keep:
            return []
        oldest_kept = cons[keep - 1]
        removed = []
        own_tmp = TEMP_PREFIX + rank_dir_name(self.rank) + "-"
        for s in steps(self.directory):
            if s >= oldest_kept:
                continue
            sd = os.path.join(self.directory, step_dir_name(s))
            for n in os.listdir(sd):
                if n == rank_dir_name(self.rank) or n.startswith(own_tmp):
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
