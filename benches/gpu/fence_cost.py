"""What fencing a released pinned batch on every stream of torch's pool costs the pool.

A pinned loader hands out batches that are copied to the GPU on a side stream (a prefetcher's
pattern) and dropped at once; a slot comes back only when the fence thread has swept the
device (every pool stream and the legacy default stream fenced and waited for). The same run
is made with the pool left unregistered (the sweep fences the legacy default stream alone, so
copies on pool streams would be unprotected: a measuring baseline, never a setting), in
alternating child processes, and the script prints images/s and the ratio.

    python3 benches/gpu/fence_cost.py --data DIR [--batches 600] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(data: str, batches: int, sweep_pool: bool) -> dict[str, float]:
    import torch

    import stoker
    from stoker import gpu, ops

    if not sweep_pool:
        gpu.pool_streams = lambda make, priorities: []  # the baseline: nothing registered
    side = torch.cuda.Stream()
    pipeline = [ops.DecodeImage(dct_scaling=True), ops.RandomResizedCrop(64), ops.ToTensor()]
    options = dict(pipeline=pipeline, batch_size=64, num_threads=8, output="torch")
    with stoker.Loader(data, pin_memory=True, prefetch=2, max_held_batches=1, **options) as pinned:
        it = iter(pinned)
        for _ in range(20):  # warm: slots locked, pool registered
            batch = next(it)
            with torch.cuda.stream(side):
                batch["image"].to("cuda", non_blocking=True)
            del batch
        torch.cuda.synchronize()
        started = time.perf_counter()
        handed = 0
        while handed < batches:
            epoch_start = handed
            for batch in it:
                with torch.cuda.stream(side):
                    batch["image"].to("cuda", non_blocking=True)
                del batch
                handed += 1
                if handed == batches:
                    break
            else:
                if handed == epoch_start:
                    raise SystemExit(f"fence_cost: {data} gives no batch")
                pinned.set_epoch(handed)
                it = iter(pinned)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    return {"images_per_s": batches * 64 / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["pool", "legacy"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.data, args.batches, args.child == "pool")))
        return 0
    try:
        import torch
    except ImportError:
        print("fence_cost: torch is not installed; nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("fence_cost: no CUDA GPU here; nothing to measure")
        return 0
    figures: dict[str, list[float]] = {"pool": [], "legacy": []}
    for _ in range(args.rounds):
        for which in ("pool", "legacy"):
            out = subprocess.run(
                [sys.executable, __file__, "--data", args.data, "--batches", str(args.batches),
                 "--child", which],
                check=True, capture_output=True, text=True, timeout=300,
            ).stdout
            figures[which].append(json.loads(out.splitlines()[-1])["images_per_s"])
    pool, legacy = (statistics.median(figures[k]) for k in ("pool", "legacy"))
    print(f"sweep of torch's pool:     {pool:,.0f} images/s (rounds {figures['pool']})")
    print(f"legacy stream alone:       {legacy:,.0f} images/s (rounds {figures['legacy']})")
    print(f"cost of the pool sweep:    {pool / legacy:.3f}x the baseline's rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
