"""Unit tests of gpupack_ckpt (python3 -m unittest discover -s checkpoint/python)."""

import json
import os
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


if __name__ == "__main__":
    unittest.main()
