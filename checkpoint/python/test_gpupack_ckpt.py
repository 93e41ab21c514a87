"""Unit tests of gpupack_ckpt (python3 -m unittest discover -s checkpoint/python)."""

import contextlib
import io
import json
import os
import shutil
import signal
import tempfile
import unittest

import gpupack_ckpt as ck


class SaveLatestTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_save_then_latest(self):
        for s in (1, 2, 10):
            ck.save(self.dir, s, {"model.bin": b"w%d" % s})
        self.assertEqual(ck.latest(self.dir), 10)
        self.assertEqual(ck.steps(self.dir), [10, 2, 1])
        self.assertEqual(sorted(os.listdir(self.dir)), [ck.step_dir_name(s) for s in (1, 2, 10)])

    def test_manifest_fields(self):
        d = ck.save(self.dir, 3, {"a/b.bin": b"xyz", "c": lambda f: f.write(b"12")})
        with open(os.path.join(d, ck.MANIFEST)) as fh:
            m = json.load(fh)
        self.assertEqual(m["version"], 1)
        self.assertEqual(m["step"], 3)
        self.assertEqual([(f["path"], f["size"]) for f in m["files"]], [("a/b.bin", 3), ("c", 2)])
        self.assertEqual(ck.verify(d)["step"], 3)

    def test_damaged_steps_are_skipped(self):
        ck.save(self.dir, 1, {"m": b"one"})
        d2 = ck.save(self.dir, 2, {"m": b"two"})
        damages = {
            "truncated": lambda: open(os.path.join(d2, "m"), "wb").write(b"tw"),
            "changed": lambda: open(os.path.join(d2, "m"), "wb").write(b"TWO"),
            "missing file": lambda: os.remove(os.path.join(d2, "m")),
            "missing manifest": lambda: os.remove(os.path.join(d2, ck.MANIFEST)),
            "bad manifest": lambda: open(os.path.join(d2, ck.MANIFEST), "w").write("{"),
        }
        for name, damage in damages.items():
            with self.subTest(name):
                ck.save(self.dir, 2, {"m": b"two"})
                self.assertEqual(ck.latest(self.dir), 2)
                damage()
                self.assertEqual(ck.latest(self.dir), 1)

    def test_resave_replaces(self):
        ck.save(self.dir, 5, {"m": b"old"})
        d = ck.save(self.dir, 5, {"m": b"new"})
        with open(os.path.join(d, "m"), "rb") as fh:
            self.assertEqual(fh.read(), b"new")
        self.assertEqual(os.listdir(self.dir), [ck.step_dir_name(5)])

    def test_temp_dirs_ignored_and_cleaned_on_error(self):
        os.mkdir(os.path.join(self.dir, ck.TEMP_PREFIX + "crashed"))
        self.assertIsNone(ck.latest(self.dir))

        def boom(_f):
            raise RuntimeError("disk full")

        with self.assertRaises(RuntimeError):
            ck.save(self.dir, 1, {"m": boom})
        self.assertEqual(os.listdir(self.dir), [ck.TEMP_PREFIX + "crashed"])

    def test_bad_input(self):
        for step in (-1, ck.MAX_STEP + 1, 1.5, True, "3"):
            with self.subTest(step=step), self.assertRaises(ValueError):
                ck.save(self.dir, step, {})
        for name in ("", "/abs", "../up", "a//b", "a/", ".", ck.MANIFEST, "a\\b"):
            with self.subTest(name=name), self.assertRaises(ValueError):
                ck.save(self.dir, 1, {name: b""})
        with self.assertRaises(TypeError):
            ck.save(self.dir, 1, {"m": "text is not bytes"})

    def test_latest_of_missing_dir(self):
        self.assertIsNone(ck.latest(os.path.join(self.dir, "nope")))


class ResumeAndSignalTest(unittest.TestCase):
    def test_resume_step(self):
        cases = {"": None, "0": 0, "1200": 1200, " 7 ": 7}
        for v, want in cases.items():
            with self.subTest(v=v):
                os.environ[ck.RESUME_ENV] = v
                self.assertEqual(ck.resume_step(), want)
        for bad in ("-1", "x", "1.5"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                os.environ[ck.RESUME_ENV] = bad
                ck.resume_step()
        del os.environ[ck.RESUME_ENV]
        self.assertIsNone(ck.resume_step())

    def test_signal_sets_flag(self):
        old = signal.getsignal(signal.SIGUSR2)
        try:
            ck.install(signals=(signal.SIGUSR2,))
            self.assertFalse(ck.requested())
            os.kill(os.getpid(), signal.SIGUSR2)
            self.assertTrue(ck.requested())
            self.assertEqual(ck.requested_signal(), signal.SIGUSR2)
        finally:
            signal.signal(signal.SIGUSR2, old)
            ck._requested.clear()


class GangTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        os.environ.pop(ck.RESUME_ENV, None)

    def tearDown(self):
        self._tmp.cleanup()
        os.environ.pop(ck.RESUME_ENV, None)

    def ranks(self, world):
        return [ck.Checkpointer(self.dir, rank=r, world_size=world, install_handler=False) for r in range(world)]

    def test_layout_and_consistency(self):
        r0, r1 = self.ranks(2)
        r0.save(10, {"model.pt": b"r0"})
        self.assertIsNone(r0.latest_consistent(), "one rank of two is not a checkpoint")
        with r1.saving(10) as p:
            os.makedirs(os.path.join(p, "shard"))
            with open(os.path.join(p, "shard", "__1_0.distcp"), "wb") as f:
                f.write(b"r1")
        self.assertEqual(r0.latest_consistent(), 10)
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, ck.step_dir_name(10)))), ["rank-0", "rank-1"])
        with open(os.path.join(r1.path(10), ck.MANIFEST)) as fh:
            m = json.load(fh)
        self.assertEqual((m["rank"], m["worldSize"], [f["path"] for f in m["files"]]), (1, 2, ["shard/__1_0.distcp"]))

    def test_torn_gang_is_never_named(self):
        r0, r1 = self.ranks(2)
        for r in (r0, r1):
            r.save(1, {"m": b"one"})
        r0.save(2, {"m": b"two"})
        r1.save(2, {"m": b"two"})
        damages = {
            "rank missing": lambda: __import__("shutil").rmtree(r1.path(2)),
            "rank file changed": lambda: open(os.path.join(r1.path(2), "m"), "wb").write(b"TWO"),
            "world size disagrees": lambda: ck.Checkpointer(self.dir, rank=1, world_size=3, install_handler=False).save(2, {"m": b"x"}),
            "rank manifest in another rank's dir": lambda: os.replace(os.path.join(r0.path(2), ck.MANIFEST), os.path.join(r1.path(2), ck.MANIFEST)),
        }
        for name, damage in damages.items():
            with self.subTest(name):
                r0.save(2, {"m": b"two"})
                r1.save(2, {"m": b"two"})
                self.assertEqual(ck.latest_consistent(self.dir), 2)
                damage()
                self.assertEqual(ck.latest_consistent(self.dir), 1)

    def test_saving_error_leaves_nothing(self):
        (r0,) = self.ranks(1)
        with self.assertRaises(RuntimeError):
            with r0.saving(3) as p:
                open(os.path.join(p, "half"), "wb").write(b"x")
                raise RuntimeError("disk full")
        self.assertEqual(os.listdir(os.path.join(self.dir, ck.step_dir_name(3))), [])
        self.assertIsNone(r0.latest_consistent())
        with self.assertRaises(ValueError):
            with r0.saving(4) as p:
                os.symlink("/etc/passwd", os.path.join(p, "link"))
        self.assertIsNone(r0.latest_consistent())

    def test_prune_keeps_newest_consistent_and_newer(self):
        r0, r1 = self.ranks(2)
        for s in (1, 2, 3):
            r0.save(s, {"m": b"%d" % s})
            r1.save(s, {"m": b"%d" % s})
        r0.save(4, {"m": b"4"})  # rank 1 still saving step 4
        self.assertEqual(r0.prune(keep=2), [1])
        self.assertEqual(r1.prune(keep=2), [1])
        self.assertEqual(ck.steps(self.dir), [4, 3, 2])
        self.assertEqual(ck.consistent_steps(self.dir), [3, 2])

    def test_resume_prefers_disk_over_a_stale_env(self):
        (r0,) = self.ranks(1)
        self.assertEqual(r0.resume(lambda p: self.fail("nothing to load")), 0)
        r0.save(0, {"m": b"zero"})
        got = []
        self.assertEqual(r0.resume(got.append), 0)
        self.assertEqual(got, [r0.path(0)])
        r0.save(5, {"m": b"five"})
        for env in ("3", "9", "junk"):  # older (stale), pruned / never written, nonsense
            with self.subTest(env=env):
                os.environ[ck.RESUME_ENV] = env
                got = []
                self.assertEqual(r0.resume(got.append), 5)
                self.assertEqual(got, [r0.path(5)])

    def test_save_does_not_copy_buffers(self):
        (r0,) = self.ranks(1)
        big = bytearray(8 << 20)
        seen = []

        def writer(f):
            f.write(big)
            seen.append(True)
        r0.save(1, {"big.bin": writer, "view": memoryview(big)[:10]})
        self.assertEqual(ck.latest_consistent(self.dir), 1)
        self.assertEqual(os.path.getsize(os.path.join(r0.path(1), "big.bin")), 8 << 20)

    def test_forked_child_does_not_act_on_the_signal(self):
        old = (signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM))
        try:
            ck.install(signals=(signal.SIGUSR2, signal.SIGTERM))
            rd, wr = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(rd)
                ok = signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
                os.kill(os.getpid(), signal.SIGUSR2)
                os.write(wr, b"1" if ok and not ck.requested() else b"0")
                os._exit(0)
            os.close(wr)
            self.assertEqual(os.read(rd, 1), b"1", "forked child kept the checkpoint handler")
            os.waitpid(pid, 0)
            self.assertFalse(ck.requested())
        finally:
            signal.signal(signal.SIGUSR2, old[0])
            signal.signal(signal.SIGTERM, old[1])
            ck._requested.clear()


class _FakeTensor:
    def __init__(self, v, device):
        self.v, self.device = list(v), device

    def item(self):
        return self.v[0]

    def tolist(self):
        return list(self.v)


class _FakeTorch:
    """torch as the helper uses it, with CUDA devices that need not exist."""
    int32 = int64 = None

    def __init__(self, device_count, current):
        outer = self

        class cuda:  # noqa: N801
            @staticmethod
            def device_count():
                return device_count

            @staticmethod
            def current_device():
                return outer.current
        self.cuda = cuda
        self.current = current
        self.devices = []

    def tensor(self, v, dtype=None, device="cpu"):
        self.devices.append(device)
        return _FakeTensor(v, device)


class _FakeDist:
    class ReduceOp:
        MAX, MIN = "max", "min"

    def __init__(self, backend, rank=0, world=2, others=0):
        self.backend, self.rank, self.world, self.others = backend, rank, world, others

    def get_backend(self):
        return self.backend

    def get_world_size(self):
        return self.world

    def get_rank(self):
        return self.rank

    def all_reduce(self, t, op):
        t.v[0] = max(t.v[0], self.others) if op == "max" else min(t.v[0], self.others)

    def broadcast(self, t, src):
        if self.rank != src:
            t.v[0] = 0x1234


class ReviewFindingsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        os.environ.pop(ck.RESUME_ENV, None)
        self._env = {k: os.environ.get(k) for k in ("LOCAL_RANK", ck.RUN_ID_ENV)}

    def tearDown(self):
        self._tmp.cleanup()
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def gang(self, world, run_id):
        return [ck.Checkpointer(self.dir, rank=r, world_size=world, install_handler=False, run_id=run_id)
                for r in range(world)]

    # 1. run identity
    def test_a_step_mixing_two_runs_is_not_consistent(self):
        a0, a1 = self.gang(2, "run-a")
        for r in (a0, a1):
            r.save(1, {"m": b"one"})
        a1.save(2, {"m": b"two"})  # run a died before rank 0 saved step 2
        with open(os.path.join(a1.path(2), ck.MANIFEST)) as fh:
            self.assertEqual(json.load(fh)["runId"], "run-a")
        b0, b1 = self.gang(2, "run-b")
        b0.save(2, {"m": b"two, from the restart"})  # the restart died before rank 1 saved
        self.assertEqual(ck.latest_consistent(self.dir), 1)
        world, verified, problems = ck.step_state(self.dir, 2)
        self.assertEqual(verified, {0, 1})
        self.assertTrue(any("different runs" in p for p in problems), problems)
        b1.save(2, {"m": b"two, from the restart"})  # not consistent: run b's save replaces run a's rank
        self.assertEqual(ck.latest_consistent(self.dir), 2)

    def test_a_shrunk_job_can_save_over_a_larger_runs_leftover_ranks(self):
        # Run a (4 ranks) died saving step 5: ranks 1..3 saved, rank 0 not.
        # Run b (2 ranks, the job shrank) resumes from 1 and saves step 5.
        for r in self.gang(4, "run-a"):
            r.save(1, {"m": b"one"})
        a = self.gang(4, "run-a")
        for r in a[1:]:
            r.save(5, {"m": b"five, run a"})
        b0, b1 = self.gang(2, "run-b")
        b1.save(5, {"m": b"five, run b"})
        self.assertEqual(ck.latest_consistent(self.dir), 1, "rank 0 missing: not consistent")
        b0.save(5, {"m": b"five, run b"})
        world, verified, problems = ck.step_state(self.dir, 5)
        self.assertEqual((world, verified, problems), (2, {0, 1}, []))
        self.assertEqual(ck.latest_consistent(self.dir), 5, "run a's ranks 2, 3 must not block run b's complete save")
        # Never a mix: run b's rank 0 alone next to run a's rank 1.
        shutil.rmtree(b1.path(5))
        a[1].save(5, {"m": b"five, run a"})
        self.assertEqual(ck.latest_consistent(self.dir), 1)
        b1.save(5, {"m": b"five, run b"})
        self.assertEqual(ck.latest_consistent(self.dir), 5)
        # Pruning removes the leftovers too: rank j >= 2 goes with rank j % 2.
        for r in (b0, b1):
            r.save(6, {"m": b"six"})
        for r in (b0, b1):
            r.prune(keep=1)
        self.assertEqual(sorted(os.listdir(self.dir)), [ck.step_dir_name(6)])

    def test_run_id_defaults(self):
        one = ck.Checkpointer(self.dir, rank=0, world_size=1, install_handler=False)
        self.assertRegex(one.run_id, r"^[0-9a-f]{16}$")
        self.assertNotEqual(one.run_id, ck.Checkpointer(self.dir, rank=0, world_size=1, install_handler=False).run_id)
        os.environ[ck.RUN_ID_ENV] = "job-uid:attempt-3"
        self.assertEqual(ck.Checkpointer(self.dir, rank=1, world_size=2, install_handler=False).run_id, "job-uid:attempt-3")
        for bad in ("", "a b", "x" * 129, 7):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                ck.Checkpointer(self.dir, rank=0, world_size=1, install_handler=False, run_id=bad)
        # With torch.distributed, rank 0's id is broadcast to every rank.
        fake_torch = _FakeTorch(0, 0)
        with _patched(ck, _dist=lambda: _FakeDist("gloo", rank=1)), _modules(torch=fake_torch):
            r1 = ck.Checkpointer(self.dir, install_handler=False)
        self.assertEqual((r1.rank, r1.run_id, fake_torch.devices), (1, "%016x" % 0x1234, ["cpu"]))

    def test_bad_run_ids_in_manifests_are_refused(self):
        (r0,) = self.gang(1, "ok")
        r0.save(1, {"m": b"x"})
        mp = os.path.join(r0.path(1), ck.MANIFEST)
        with open(mp) as fh:
            m = json.load(fh)
        for bad in ("", None, 7, "a/b"):
            with self.subTest(bad=bad):
                m["runId"] = bad
                with open(mp, "w") as fh:
                    json.dump(m, fh)
                self.assertIsNone(ck.latest_consistent(self.dir))

    # 3. world size
    def test_resume_refuses_another_world_size(self):
        for r in self.gang(2, "a"):
            r.save(5, {"m": b"rank %d" % r.rank})
        four = self.gang(4, "b")
        for c in four:
            with self.subTest(rank=c.rank), self.assertRaises(ck.WorldSizeMismatch) as cm:
                c.resume(lambda p: self.fail("loaded a shard of another world size"))
            self.assertIn("saved by 2 ranks, but this job has 4", str(cm.exception))
            with self.assertRaises(ck.WorldSizeMismatch):
                c.load()
        got = []
        self.assertEqual(four[3].resume(got.append, on_world_change="replicated"), 5)
        self.assertEqual(got, [os.path.join(self.dir, ck.step_dir_name(5), "rank-1")])
        (one,) = self.gang(1, "c")
        with self.assertRaises(ck.WorldSizeMismatch):
            one.resume_step()
        self.assertEqual(one.paths(5), [os.path.join(self.dir, ck.step_dir_name(5), "rank-%d" % r) for r in (0, 1)])
        # The same world size resumes as before.
        self.assertEqual(self.gang(2, "d")[1].resume(got.append), 5)

    # 4. the device of the collectives
    def test_collective_device(self):
        cases = [
            ("gloo", 8, 0, "3", "cpu"),
            ("nccl", 8, 0, "3", "cuda:3"),   # set_device never called: LOCAL_RANK's GPU, not GPU 0
            ("nccl", 8, 5, "3", "cuda:5"),   # the trainer's own torch.cuda.set_device wins
            ("nccl", 1, 0, "3", "cuda:0"),   # one visible GPU per process
            ("nccl", 8, 0, "", "cuda:0"),
            ("nccl", 2, 0, "7", "cuda:0"),   # LOCAL_RANK beyond the visible GPUs
        ]
        for backend, n, cur, lr, want in cases:
            with self.subTest(backend=backend, n=n, cur=cur, lr=lr):
                os.environ["LOCAL_RANK"] = lr
                fake_torch = _FakeTorch(n, cur)
                with _modules(torch=fake_torch):
                    self.assertEqual(ck._collective_device(_FakeDist(backend)), want)
        with _modules(torch=_FakeTorch(8, 0)):
            self.assertEqual(ck._collective_device(_FakeDist("nccl"), device="cuda:6"), "cuda:6")

    def test_should_stop_and_resume_use_the_ranks_device(self):
        os.environ["LOCAL_RANK"] = "2"
        fake_torch = _FakeTorch(4, 0)
        with _patched(ck, _dist=lambda: _FakeDist("nccl", rank=2, world=4, others=1)), _modules(torch=fake_torch):
            c = ck.Checkpointer(self.dir, install_handler=False)
            self.assertTrue(c.should_stop(), "another rank's request reaches this one")
            self.assertEqual(c.resume_step(), 0)
        self.assertEqual(set(fake_torch.devices), {"cuda:2"})
        self.assertGreaterEqual(len(fake_torch.devices), 4)  # run id, should_stop, resume's steps and verdicts

    # 5. symlinks and atomic re-saves
    def test_symlinked_rank_dir_is_refused(self):
        a0, a1 = self.gang(2, "a")
        for r in (a0, a1):
            r.save(1, {"m": b"one"})
        other = os.path.join(self.dir, "elsewhere")
        o1 = ck.Checkpointer(other, rank=1, world_size=2, install_handler=False, run_id="a")
        o1.save(2, {"m": b"two"})
        a0.save(2, {"m": b"two"})
        os.symlink(o1.path(2), a1.path(2))
        self.assertEqual(ck.latest_consistent(self.dir), 1)
        _, _, problems = ck.step_state(self.dir, 2)
        self.assertTrue(any("symlink" in p for p in problems), problems)

    def test_resave_is_atomic(self):
        a0, a1 = self.gang(2, "a")
        for r in (a0, a1):
            r.save(1, {"m": b"one"})
            r.save(2, {"m": b"two"})
        calls = []

        def checked(fn, name):
            def wrapper(a, b):
                fn(a, b)
                calls.append(name)
                self.assertEqual(ck.latest_consistent(self.dir), 2,
                                 "after %s (calls %s) step 2 is not consistent: a crash here loses it" % (name, calls))
            return wrapper
        with _patched(ck, _rename=checked(os.rename, "rename"), _exchange=checked(ck._exchange, "exchange")):
            a1.save(2, {"m": b"two, again"})
            ck.save(os.path.join(self.dir, "single"), 3, {"m": b"x"})
            ck.save(os.path.join(self.dir, "single"), 3, {"m": b"y"})
        with open(os.path.join(a1.path(2), "m"), "rb") as fh:
            self.assertEqual(fh.read(), b"two, again")
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, ck.step_dir_name(2)))), ["rank-0", "rank-1"])

    def test_a_later_run_does_not_resave_a_consistent_step(self):
        a0, a1 = self.gang(2, "a")
        for s in (1, 2):
            for r in (a0, a1):
                r.save(s, {"m": b"a%d" % s})
            for r in (a0, a1):
                r.prune(keep=1)
        self.assertEqual(ck.consistent_steps(self.dir), [2])
        b0, b1 = self.gang(2, "b")
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(b0.save(2, {"m": b"b2"}), b0.path(2))  # rank 1 of run b dies before saving
        self.assertIn("already consistent", err.getvalue())
        self.assertEqual(ck.latest_consistent(self.dir), 2)
        _, _, problems = ck.step_state(self.dir, 2)
        self.assertEqual(problems, [])
        with open(os.path.join(b0.path(2), "m"), "rb") as fh:
            self.assertEqual(fh.read(), b"a2")
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, ck.step_dir_name(2)))), ["rank-0", "rank-1"])
        # The same run may still re-save its own step, and a torn step of
        # another run is completed as before.
        with contextlib.redirect_stderr(io.StringIO()) as err:
            a1.save(2, {"m": b"a2 again"})
        self.assertEqual(err.getvalue(), "")
        b0.save(3, {"m": b"b3"})
        b1.save(3, {"m": b"b3"})
        self.assertEqual(ck.latest_consistent(self.dir), 3)

    def test_an_empty_rank_dir_is_not_committed(self):
        a0, = self.gang(1, "a")
        with self.assertRaisesRegex(ValueError, "empty checkpoint"):
            with a0.saving(1):
                pass
        self.assertEqual(ck.latest_consistent(self.dir), None)
        self.assertEqual(os.listdir(os.path.join(self.dir, ck.step_dir_name(1))), [])

    def test_a_file_written_while_hashed_is_refused(self):
        a0, = self.gang(1, "a")
        real = ck.hashlib.sha256

        class Racing:
            """An async writer still appending while the commit hashes."""
            def __init__(self):
                self.h, self.done = real(), False

            def update(self, b):
                self.h.update(b)
                if not self.done:
                    self.done = True
                    with open(os.path.join(tmp[0], "model.pt"), "ab") as fh:
                        fh.write(b"more")

            def hexdigest(self):
                return self.h.hexdigest()
        tmp = []
        with _patched(ck.hashlib, sha256=Racing):
            with self.assertRaisesRegex(ValueError, "changed while it was hashed"):
                with a0.saving(1) as p:
                    tmp.append(p)
                    with open(os.path.join(p, "model.pt"), "wb") as fh:
                        fh.write(b"weights")
        self.assertEqual(ck.latest_consistent(self.dir), None)

    def test_resume_warns_about_torn_steps_and_a_missing_process_group(self):
        a0, a1 = self.gang(2, "a")
        a0.save(1, {"m": b"one"})  # rank 1 never saved: torn
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(a0.resume(lambda p: self.fail("loaded a torn step")), 0)
        self.assertIn("none is consistent", err.getvalue())
        self.assertIn("torch.distributed is not initialised", err.getvalue())
        one, = self.gang(1, "b")
        with contextlib.redirect_stderr(io.StringIO()) as err:
            ck.Checkpointer(os.path.join(self.dir, "empty"), rank=0, world_size=1,
                            install_handler=False).resume(lambda p: None)
        self.assertEqual(err.getvalue(), "")

    def test_another_jobs_step_is_ignored_when_both_job_ids_are_known(self):
        os.environ[ck.JOB_UID_ENV] = "other"
        try:
            for r in self.gang(2, "x"):
                r.save(777, {"m": b"y"})
            with open(os.path.join(self.gang(2, "x")[0].path(777), ck.MANIFEST)) as fh:
                self.assertEqual(json.load(fh)["jobId"], "other")
            self.assertEqual(ck.latest_consistent(self.dir), 777)
            os.environ[ck.JOB_UID_ENV] = "mine"
            self.assertEqual(ck.latest_consistent(self.dir), None)
            self.assertEqual(ck.step_state(self.dir, 777, job_id="other")[1], {0, 1})
        finally:
            os.environ.pop(ck.JOB_UID_ENV, None)
        self.assertEqual(ck.latest_consistent(self.dir), 777)


class AnotherJobTest(unittest.TestCase):
    """Issue 16 review H2, the checkpoint side: a re-created job (a new
    GPUPACK_JOB_UID) or a second job in the same directory never replaces
    or prunes the first job's rank directories."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        self._old = os.environ.pop(ck.JOB_UID_ENV, None)

    def tearDown(self):
        os.environ.pop(ck.JOB_UID_ENV, None)
        if self._old is not None:
            os.environ[ck.JOB_UID_ENV] = self._old
        self._tmp.cleanup()

    def job(self, uid, run):
        os.environ[ck.JOB_UID_ENV] = uid
        return [ck.Checkpointer(self.dir, rank=r, world_size=2, install_handler=False, run_id=run) for r in range(2)]

    def test_saving_and_prune_leave_another_jobs_rank_dirs_alone(self):
        for step in (1000, 2000, 3000):
            for r in self.job("uid-a", "ra"):
                r.save(step, {"m": b"a%d" % step})
                r.prune(keep=2)
        self.assertEqual(ck.consistent_steps(self.dir), [3000, 2000])
        b = self.job("uid-b", "rb")
        for step in (2000, 3000):
            with self.assertRaisesRegex(ValueError, "another job"):
                b[0].save(step, {"m": b"b"})
        with contextlib.redirect_stderr(io.StringIO()) as err:
            for step in (4000, 5000):
                for r in b:
                    r.save(step, {"m": b"b%d" % step})
                    r.prune(keep=2)
        self.assertIn("belongs to another job", err.getvalue())
        self.assertEqual(ck.consistent_steps(self.dir), [5000, 4000])
        os.environ[ck.JOB_UID_ENV] = "uid-a"
        self.assertEqual(ck.consistent_steps(self.dir), [3000, 2000])


class TieredTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.shared = os.path.join(self._tmp.name, "shared")
        self.local = os.path.join(self._tmp.name, "local")
        os.environ.pop(ck.LOCAL_DIR_ENV, None)

    def tearDown(self):
        self._tmp.cleanup()

    def upload(self, step, rank=0):
        """What gpupack-ckpt's uploader does (Go: manifest.Upload)."""
        import shutil
        src = os.path.join(self.local, ck.step_dir_name(step), ck.rank_dir_name(rank))
        dst = os.path.join(self.shared, ck.step_dir_name(step), ck.rank_dir_name(rank))
        shutil.copytree(src, dst)
        with open(os.path.join(dst, ck.MANIFEST)) as fh:
            m = json.load(fh)
        m["tier"] = ck.TIER_SHARED
        with open(os.path.join(dst, ck.MANIFEST), "w") as fh:
            json.dump(m, fh)

    def test_saves_go_to_the_local_tier_and_reads_to_the_shared_one(self):
        os.environ["NODE_NAME"] = "node-7"
        try:
            c = ck.Checkpointer(self.shared, rank=0, world_size=1, install_handler=False, local_dir=self.local)
            p = c.save(3, {"m": b"three"})
        finally:
            del os.environ["NODE_NAME"]
        self.assertEqual(p, c.local_path(3))
        with open(os.path.join(p, ck.MANIFEST)) as fh:
            m = json.load(fh)
        self.assertEqual((m["tier"], m["node"], m["localWorldSize"]), ("local", "node-7", 1))
        self.assertEqual(ck.latest_consistent(self.local), 3)
        self.assertIsNone(c.latest_consistent(), "not readable where the restart looks until uploaded")
        self.assertEqual(c.resume(lambda p: self.fail("loaded a local-only step")), 0)
        self.upload(3)
        got = []
        self.assertEqual(c.resume(got.append), 3)
        self.assertEqual(got, [c.path(3)])

    def test_bad_tier_settings(self):
        with self.assertRaises(ValueError):
            ck.Checkpointer(self.shared, rank=0, world_size=1, install_handler=False, local_dir=self.shared + "/")
        with self.assertRaises(ValueError):
            ck.Checkpointer(self.shared, rank=0, world_size=2, install_handler=False, local_dir=self.local, local_world_size=3)
        os.environ[ck.LOCAL_DIR_ENV] = self.local
        try:
            self.assertEqual(ck.Checkpointer(self.shared, rank=0, world_size=1, install_handler=False).local_dir, self.local)
        finally:
            del os.environ[ck.LOCAL_DIR_ENV]
        c = ck.Checkpointer(self.shared, rank=0, world_size=1, install_handler=False, local_dir=self.local)
        c.save(1, {"m": b"x"})
        mp = os.path.join(c.local_path(1), ck.MANIFEST)
        with open(mp) as fh:
            m = json.load(fh)
        for field, bad in (("tier", "nvme"), ("node", "a\nb"), ("localWorldSize", 2), ("localWorldSize", 0)):
            with self.subTest(field=field, bad=bad):
                with open(mp, "w") as fh:
                    json.dump(dict(m, **{field: bad}), fh)
                self.assertIsNone(ck.latest_consistent(self.local))

    def test_prune_follows_the_shared_tier(self):
        c = ck.Checkpointer(self.shared, rank=0, world_size=1, install_handler=False, local_dir=self.local)
        for s in (1, 2, 3, 4):
            c.save(s, {"m": b"%d" % s})
        for s in (1, 2, 3):
            self.upload(s)
        self.assertEqual(c.prune(keep=2), [1])
        self.assertEqual(ck.steps(self.shared), [3, 2])
        self.assertEqual(ck.steps(self.local), [4, 3, 2], "step 4 is not uploaded yet: kept")


@contextlib.contextmanager
def _patched(obj, **attrs):
    old = {k: getattr(obj, k) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


@contextlib.contextmanager
def _modules(**mods):
    import sys
    old = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


if __name__ == "__main__":
    unittest.main()
