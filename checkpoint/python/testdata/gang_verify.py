"""Run under torchrun (gloo): which bytes does each rank hash when the gang
asks which step is consistent, resumes and prunes? Each rank writes
<out>/rank-<r>.json: per phase, the step it got and the bytes of checkpoint
files it opened for reading (rank directory -> bytes). The counting wraps
the helper's open(), so it works with any version of the helper.

Phases (ranks agree through barriers): save steps 1..3 (rank r's shard is
(r + 1) MiB); "clean": latest_consistent(), resume(); "corrupt": rank 0
flips a byte of rank 1's step-3 shard (same size) and every rank asks
again; "mixed": rank 1's step-2 manifest is rewritten to name another run
and every rank asks again; "prune": prune(keep=1).
"""

import argparse
import builtins
import collections
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupack_ckpt  # noqa: E402

import torch.distributed as dist  # noqa: E402

MIB = 1 << 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    ck = gpupack_ckpt.Checkpointer(a.dir, install_handler=False)
    for s in (1, 2, 3):
        ck.save(s, {"shard.bin": bytes([rank + s]) * ((rank + 1) * MIB)})
    dist.barrier()

    counted = collections.Counter()
    real_open = builtins.open

    def counting_open(path, mode="r", *args, **kw):
        f = real_open(path, mode, *args, **kw)
        if "r" in mode and "+" not in mode and os.path.basename(str(path)) != gpupack_ckpt.MANIFEST:
            counted[os.path.relpath(os.path.dirname(os.path.abspath(str(path))), os.path.abspath(a.dir))] += os.path.getsize(path)
        return f

    gpupack_ckpt.open = counting_open  # module globals come before builtins
    result = {"rank": rank}

    def phase(name, fn):
        counted.clear()
        got = fn()
        result[name] = {"step": got, "bytes": dict(counted)}
        dist.barrier()

    phase("clean-latest", ck.latest_consistent)
    phase("clean-resume", lambda: ck.resume(lambda path: None))
    if rank == 0:
        shard = os.path.join(a.dir, gpupack_ckpt.step_dir_name(3), "rank-1", "shard.bin")
        with real_open(shard, "r+b") as f:
            f.seek(12345)
            b = f.read(1)
            f.seek(12345)
            f.write(bytes([b[0] ^ 0xff]))
    dist.barrier()
    phase("corrupt-latest", ck.latest_consistent)
    phase("corrupt-resume", lambda: ck.resume(lambda path: None))
    if rank == 1:
        m = os.path.join(a.dir, gpupack_ckpt.step_dir_name(2), "rank-1", gpupack_ckpt.MANIFEST)
        with real_open(m) as f:
            doc = json.load(f)
        doc["runId"] = "another-run"
        with real_open(m, "w") as f:
            json.dump(doc, f)
    dist.barrier()
    phase("mixed-latest", ck.latest_consistent)
    phase("prune", lambda: ck.prune(keep=1))
    with real_open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
