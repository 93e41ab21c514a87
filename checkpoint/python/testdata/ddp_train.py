"""A small DDP trainer (CPU, gloo) for the torchrun end-to-end tests.

Run under torchrun. Each rank appends "<rank> <step> <loss>" to --losses for
every step it trains, "<rank> saved <step>" after each checkpoint and
"<rank> resumed <step>" at start. The loop is the one docs/preemption.md
opens with. --save dcp writes the model with torch.distributed.checkpoint's
FileSystemWriter (one self-contained DCP checkpoint per rank directory).
"""

import os
import sys

if "--losses" in sys.argv:
    # First thing, before torch is imported: "<rank> started <pid>" (a
    # worker group torchrun restarts shows up even if it dies importing).
    with open(sys.argv[sys.argv.index("--losses") + 1], "a") as _f:
        _f.write("%s started %d\n" % (os.environ.get("RANK", "-1"), os.getpid()))

import argparse  # noqa: E402
import datetime  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupack_ckpt  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

BATCH = 4


def dcp():
    """torch.distributed.checkpoint (torch >= 2.0) or 1.13's _shard.checkpoint.

    Debian's torch 1.13 on Python 3.11 cannot import _shard as shipped (a
    dataclass with an unhashable default that 3.11 refuses); the shim makes
    that default hashable for the import only. Test-side only."""
    try:
        import torch.distributed.checkpoint as m
        return m
    except ImportError:
        pass
    import dataclasses
    orig = dataclasses._get_field

    def lenient(cls, name, type_, *a):
        try:
            return orig(cls, name, type_, *a)
        except ValueError as e:
            d = cls.__dict__.get(name)
            if isinstance(d, dataclasses.Field):
                d = d.default
            if "mutable default" in str(e) and d is not None and type(d).__hash__ is None:
                type(d).__hash__ = object.__hash__
                return orig(cls, name, type_, *a)
            raise
    dataclasses._get_field = lenient
    try:
        import torch.distributed._shard.checkpoint as m
    finally:
        dataclasses._get_field = orig
    return m


class Samples(Dataset):
    """Item i is fixed by i alone, so a resumed run sees the same batches."""

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(dim=0, keepdim=True) * 0.5


class Steps:
    """Batch sampler: the indices of step s of this rank, from a start step."""

    def __init__(self, start, total, rank, world):
        self.start, self.total, self.rank, self.world = start, total, rank, world

    def __iter__(self):
        for s in range(self.start, self.total):
            base = (s * self.world + self.rank) * BATCH
            yield list(range(base, base + BATCH))

    def __len__(self):
        return self.total - self.start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--losses", required=True)
    p.add_argument("--total-steps", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--save", choices=["pt", "dcp"], default="pt")
    p.add_argument("--self-signal", default="", help="RANK:STEP: that rank alone gets SIGUSR1 after that step")
    p.add_argument("--local-dir", default=None, help="tiered: save to this node-local directory first")
    p.add_argument("--exit-linger", type=float, default=0,
                   help="after the stop save, linger this long with SIGTERM at its default (as the interpreter's "
                        "shutdown, which resets the helper's handler, does on torch 1.13 for seconds)")
    p.add_argument("--stop-save-time", type=float, default=0,
                   help="the save after a request takes this many seconds longer (a big model)")
    a = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    out = open(a.losses, "a", buffering=1)

    def save(path):
        if a.save == "dcp":
            m = dcp()
            m.save_state_dict(model.module.state_dict(), m.FileSystemWriter(os.path.join(path, "model")), no_dist=True)
        else:
            torch.save(model.module.state_dict(), os.path.join(path, "model.pt"))
        torch.save(opt.state_dict(), os.path.join(path, "optim.pt"))

    def load(path):
        if a.save == "dcp":
            m = dcp()
            sd = model.module.state_dict()
            m.load_state_dict(sd, m.FileSystemReader(os.path.join(path, "model")), no_dist=True)
            model.module.load_state_dict(sd)
        else:
            model.module.load_state_dict(torch.load(os.path.join(path, "model.pt")))
        opt.load_state_dict(torch.load(os.path.join(path, "optim.pt")))

    # --- the loop of docs/preemption.md ---
    ck = gpupack_ckpt.Checkpointer(a.dir, local_dir=a.local_dir)
    step = ck.resume(load)
    out.write("%d resumed %d\n" % (rank, step))
    loader = iter(DataLoader(Samples(), batch_sampler=Steps(step, a.total_steps, rank, world), num_workers=2))
    while step < a.total_steps:
        x, y = next(loader)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        step += 1
        out.write("%d %d %.9f\n" % (rank, step, loss.item()))
        time.sleep(a.step_time)
        if a.self_signal and a.self_signal == "%d:%d" % (rank, step):
            os.kill(os.getpid(), signal.SIGUSR1)
        if ck.should_stop() or step % a.save_every == 0:
            with ck.saving(step) as path:
                save(path)
                if ck.stopping and a.stop_save_time:
                    out.write("%d saving %d\n" % (rank, step))
                    time.sleep(a.stop_save_time)
                    out.write("%d workers %d\n" % (rank, len([w for w in loader._workers if w.is_alive()])))
            out.write("%d saved %d\n" % (rank, step))
            if ck.stopping:
                if a.exit_linger:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    time.sleep(a.exit_linger)
                sys.exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
