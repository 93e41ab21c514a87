"""A stand-in trainer for gpupack-ckpt's process tests.

Modes:
  cooperative  installs gpupack_ckpt's handler; each step sleeps --step-time;
               on a request it saves the current step and exits 0.
  ignore       records the signals it gets (to --events) but does nothing
               about them, and never exits on its own.
  saveloop     saves --saves checkpoints back to back (each --size bytes in
               two files), printing "saved N" after each; for kill -9 tests.
  exit         exits with status --code at once.

It writes "ready" to stdout (flushed) once its handlers are in place.
"""

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupack_ckpt as ck  # noqa: E402


def record(path, what):
    if not path:
        return
    with open(path, "a") as f:
        f.write("%.6f %s\n" % (time.time(), what))
        f.flush()
        os.fsync(f.fileno())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["cooperative", "ignore", "saveloop", "exit"])
    p.add_argument("--dir", default="")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--saves", type=int, default=100)
    p.add_argument("--size", type=int, default=1 << 16)
    p.add_argument("--events", default="")
    p.add_argument("--code", type=int, default=0)
    p.add_argument("--save-delay", type=float, default=0, help="sleep this long before a requested save")
    p.add_argument("--late-save", type=float, default=0,
                   help="on a request, first save the current step as a periodic save would, sleep this long, then save the next step and exit (a periodic save racing the request)")
    a = p.parse_args()

    if a.mode == "exit":
        sys.exit(a.code)

    if a.mode == "ignore":
        def note(signum, _frame):
            record(a.events, signal.Signals(signum).name)
        for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(s, note)
        print("ready", flush=True)
        while True:
            time.sleep(3600)

    if a.mode == "saveloop":
        start = (ck.latest(a.dir) or 0) + 1
        print("ready", flush=True)
        for step in range(start, start + a.saves):
            payload = os.urandom(a.size)
            ck.save(a.dir, step, {"model.bin": payload, "optim/state.bin": payload[: a.size // 2]})
            print("saved %d" % step, flush=True)
        return

    # cooperative
    ck.install()
    step = ck.resume_step() or 0
    record(a.events, "ready")
    print("ready", flush=True)
    while True:
        time.sleep(a.step_time)
        step += 1
        if ck.requested() and a.late_save:
            ck.save(a.dir, step, {"model.bin": ("weights at %d" % step).encode()})
            record(a.events, "saved %d" % step)
            time.sleep(a.late_save)
            a.late_save = 0
            step += 1
        if ck.requested() or (a.save_every and step % a.save_every == 0):
            if ck.requested() and a.save_delay:
                record(a.events, "saving slowly")
                time.sleep(a.save_delay)
            ck.save(a.dir, step, {"model.bin": ("weights at %d" % step).encode()})
            record(a.events, "saved %d" % step)
            if ck.requested():
                record(a.events, "exit after %s" % signal.Signals(ck.requested_signal()).name)
                sys.exit(0)


if __name__ == "__main__":
    main()
