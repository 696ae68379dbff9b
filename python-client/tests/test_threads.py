"""The default thread count under launchers: ``num_threads=None`` divides a whole-node affinity
by ``LOCAL_WORLD_SIZE`` and keeps an affinity the launcher already split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
from stoker import _native

_CHILD = """
import json, os, sys
import stoker
os.sched_setaffinity(0, json.loads(sys.argv[2]))
with stoker.Loader(sys.argv[1], pipeline=stoker.vision.imagenet_train(32), batch_size=4,
                   output="numpy") as loader:
    print(json.dumps([loader.num_threads, loader.stats()["thread_rule"]]))
"""

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform"
)


def _threads(dataset: Path, cpus: list[int], local_world_size: str | None) -> tuple[int, str]:
    env = dict(os.environ)
    env.pop("LOCAL_WORLD_SIZE", None)
    if local_world_size is not None:
        env["LOCAL_WORLD_SIZE"] = local_world_size
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(dataset), json.dumps(cpus)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    threads, rule = json.loads(out.stdout.strip().splitlines()[-1])
    return int(threads), str(rule)


@needs_affinity
def test_a_whole_node_affinity_is_divided_by_local_world_size(dataset: Path) -> None:
    node = list(range(os.cpu_count() or 1))
    if len(node) < 2:
        pytest.skip("needs at least 2 CPUs")
    threads, rule = _threads(dataset, node, "2")
    # The node's CPUs, or fewer under a cgroup quota, which the division honours too.
    assert threads == max(1, min(len(node), _native.available_threads()) // 2)
    assert "LOCAL_WORLD_SIZE=2" in rule and "cgroup quota" in rule


@needs_affinity
def test_an_affinity_already_split_is_kept(dataset: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs at least 2 CPUs")
    threads, rule = _threads(dataset, [0], "2")
    assert threads == 1
    assert "already split" in rule


@needs_affinity
def test_without_a_launcher_every_available_cpu(dataset: Path) -> None:
    node = list(range(os.cpu_count() or 1))
    threads, rule = _threads(dataset, node, None)
    # The native side also honours a cgroup CPU quota, which may be below the CPU count.
    assert 1 <= threads <= len(node)
    assert "available" in rule


def test_a_bad_local_world_size_is_named(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        stoker.Loader(dataset, pipeline=stoker.vision.imagenet_train(32), batch_size=4)
