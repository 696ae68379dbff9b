"""Ranks and world size: where a loader takes them from, and the check that the ranks of a real
torch.distributed job (two processes on gloo over 127.0.0.1) read shares that fit together."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import stoker
from conftest import torch_or_skip


def test_the_environment_gives_both_or_neither(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning's launcher sets WORLD_SIZE (and LOCAL_RANK) for its children, not RANK: every
    # child would read as rank 0 of N.
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match="sets WORLD_SIZE='4' but not RANK"):
        make_loader()
    assert make_loader(rank=2, world_size=4).rank == 2
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: its rank can only be 0
    assert (make_loader().rank, make_loader().world_size) == (0, 1)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="sets RANK='1' but not WORLD_SIZE"):
        make_loader()


def test_a_rank_or_world_size_alone_is_paired_only_with_defaults_that_agree(
    make_loader: Callable[..., stoker.Loader], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="world_size=4 was given without rank="):
        make_loader(world_size=4)
    assert (make_loader(world_size=1).rank, make_loader(rank=0).world_size) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    # One rank alone (a rank-0-only evaluation loader) pairs with nothing.
    assert (make_loader(world_size=1).rank, make_loader(world_size=1).world_size) == (0, 1)
    assert (make_loader(rank=2).world_size, make_loader(world_size=4).rank) == (4, 2)
    # rank=LOCAL_RANK beside a global world size: nodes would read each other's shares.
    with pytest.raises(ValueError, match=r"rank=1 was given alone.*rank 2 of world size 4"):
        make_loader(rank=1)
    with pytest.raises(ValueError, match="world_size=8 was given alone"):
        make_loader(world_size=8)
    assert (make_loader(rank=1, world_size=8).rank, make_loader(rank=1, world_size=8).world_size) \
        == (1, 8)


_RANK_SCRIPT = r"""
import datetime, json, sys, time
import torch.distributed as dist
import stoker

rank, port, data, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
options = dict(pipeline=stoker.vision.imagenet_train(32), batch_size=8, num_threads=1,
               output="numpy", timeout=60)
out = {}

def attempt(name, make):
    try:
        loader = make()
        iterator = iter(loader)
        next(iterator)
        out[name] = ["ok", [int(i) for i in iterator.sample_indices], len(loader)]
        loader.close()
    except Exception as error:
        out[name] = [type(error).__name__, str(error)]

early = stoker.Loader(data, **options)  # before torch.distributed: rank 0 of 1
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
attempt("made_before_init", lambda: early)
attempt("agree", lambda: stoker.Loader(data, seed=3, **options))
attempt("seed_per_rank", lambda: stoker.Loader(data, seed=rank, **options))
attempt("one_file_more", lambda: stoker.Loader(data if rank == 0 else extra, **options))
attempt("a_group_of_its_own", lambda: stoker.Loader(data, rank=0, world_size=1, **options))

def refused_twice():
    # Rank 1 tries again at once, before rank 0 read the posts: each rank still reads the
    # same refusal (a second try once counted as a second read, the posts went, and rank 0
    # timed out blaming every rank).
    loader = stoker.Loader(data, seed=rank, **options)  # posts its settings
    if rank == 0:
        time.sleep(1)
    errors = []
    for _ in range(2 if rank == 0 else 3):
        try:
            iter(loader)
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}")
    raise ValueError(" | ".join(errors))

attempt("refused_twice", refused_twice)
dist.barrier()
# Every rank has read the posts of the checks above: the last to read took them away.
store = dist.distributed_c10d._get_default_store()
out["posts_left"] = [store.check([f"stoker/ranks/{n}/{r}"]) for n in range(4) for r in range(2)]
if rank == 0:
    attempt("made_by_one_rank", lambda: stoker.Loader(data, **{**options, "timeout": 2}))
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_the_ranks_of_a_torch_distributed_job_are_checked_to_read_alike(
    dataset: Path, tmp_path: Path
) -> None:
    torch_or_skip()
    extra = tmp_path / "one-more"
    shutil.copytree(dataset, extra)
    first_class = sorted(p for p in extra.iterdir() if p.is_dir())[0]
    first_image = sorted(first_class.iterdir())[0]
    shutil.copy(first_image, first_class / ("zz-" + first_image.name))
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT, str(rank), port, str(dataset), str(extra)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for rank in range(2)
    ]
    results = []
    for process in ranks:
        try:
            stdout, stderr = process.communicate(timeout=240)
        finally:
            process.kill()
        assert process.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    for rank, out in enumerate(results):
        kind, message = out["made_before_init"]
        assert kind == "ValueError", out
        assert "made as rank 0 of 1" in message and f"now runs rank {rank} of 2" in message
        kind, message = out["seed_per_rank"]
        assert kind == "ValueError" and "seed: 0 on rank 0, 1 on rank 1" in message, out
        kind, message = out["one_file_more"]
        assert kind == "ValueError", out
        assert "num_samples: 120 on rank 0, 121 on rank 1" in message, message
        assert out["a_group_of_its_own"][0] == "ok", out
        tries = out["refused_twice"][1].split(" | ")
        assert len(tries) == (2 if rank == 0 else 3), tries
        assert all(t.startswith("ValueError") and "seed: 0 on rank 0" in t for t in tries), tries
    # Agreeing ranks read disjoint first batches, with as many steps each.
    (kind0, first0, steps0), (kind1, first1, steps1) = (r["agree"] for r in results)
    assert kind0 == kind1 == "ok" and steps0 == steps1 == 8
    assert not set(first0) & set(first1)
    assert not any(results[0]["posts_left"]), results[0]["posts_left"]
    kind, message = results[0]["made_by_one_rank"]
    assert kind == "LoaderTimeoutError" and "rank 1 did not make loader" in message, message
