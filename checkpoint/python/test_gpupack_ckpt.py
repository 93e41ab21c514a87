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


if __name__ == "__main__":
    unittest.main()
