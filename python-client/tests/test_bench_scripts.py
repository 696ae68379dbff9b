"""The GPU benchmark scripts where they run without a GPU: ``benches/gpu_train.py``'s rows'
names are read as its documentation says, every kind of row's result prints (an in-process lane
row, a helper-process row, a skipped DALI row), and without a CUDA GPU it and the GPU check's
other scripts (``benches/gpu/``) say so and exit 0; the GPU check's shell scripts exit with a
failed step's status. What they measure runs only on a GPU machine
(``benches/gpu/decode_check.sh``)."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benches" / "gpu_train.py"


@pytest.fixture(scope="module")
def gpu_train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("row", "parts"),
    [
        ("ceiling", (True, "ceiling", 15, "", False, False, False)),
        ("stoker-auto@7", (True, "stoker-auto", 7, "", False, False, False)),
        ("loader:stoker-gpu", (False, "stoker-gpu", 15, "", False, False, False)),
        ("stoker-gpu-sms16", (True, "stoker-gpu", 15, "16", False, False, False)),
        ("stoker-auto-fused", (True, "stoker-auto", 15, "", True, False, False)),
        ("helper-gpu-fused@7", (True, "helper-gpu", 7, "", True, False, False)),
        ("loader:stoker-auto-fused-sms32@3", (False, "stoker-auto", 3, "32", True, False, False)),
        ("stoker-gpu-sms16-fused", (True, "stoker-gpu", 15, "16", True, False, False)),
        ("dali-hw99", (True, "dali-hw99", 15, "", False, False, False)),
        ("dali-crop-hw80@7", (True, "dali-crop-hw80", 7, "", False, False, False)),
        ("stoker-auto-laneproc", (True, "stoker-auto", 15, "", False, True, False)),
        ("loader:stoker-gpu-laneproc-fused@7", (False, "stoker-gpu", 7, "", True, True, False)),
        ("stoker-auto-roi", (True, "stoker-auto", 15, "", False, False, True)),
        ("stoker-gpu-roi-fused@7", (True, "stoker-gpu", 7, "", True, False, True)),
        ("loader:stoker-auto-laneproc-roi", (False, "stoker-auto", 15, "", False, True, True)),
    ],
)
def test_a_rows_name_is_read_as_documented(
    gpu_train: ModuleType, row: str, parts: tuple[bool, str, int, str, bool, bool, bool]
) -> None:
    assert gpu_train.row_parts(row, 15) == parts


def test_every_kind_of_result_prints(
    gpu_train: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    common = {
        "model": "resnet18",
        "images_per_s": 9000.0,
        "host_wait_fraction": 0.01,
        "gpu_idle_fraction": 0.02,
        "build_s": 0.5,
        "first_batch_s": 0.1,
        "threads": 15,
        "trains": True,
    }
    lane = {
        "nvjpeg_allocations": 7,
        "rows": 1000,
        "rows_dtype": "bfloat16",
        "declined_rows": 1,
        "fallback_rows": 2,
        "gpu_rows_per_s": 9000.0,
        "cpu_rows_per_s": 3000.0,
        "memory_bytes": 512 << 20,
    }
    in_process = {
        **common,
        "row": "stoker-auto-fused",
        "gpu_decode": lane,
        "stoker_gpu_lane_cost_fraction": 0.2,
        "stoker_gpu_lane_quiet_steps": 0,
        "share_of_ceiling": 0.7,
        "ceiling_x_busy": 12000.0,
    }
    # A helper row's figures come from the helper process's loader, and may be missing.
    # A helper process's lane reports no nvJPEG allocations.
    helper_lane = {key: value for key, value in lane.items() if key != "nvjpeg_allocations"}
    helper = {**common, "row": "helper-gpu", "gpu_decode": helper_lane}
    skipped = {"model": "resnet18", "row": "dali", "skipped": "nvidia.dali is not importable"}
    by_region = {
        **in_process,
        "row": "stoker-gpu-roi",
        "gpu_decode": {**lane, "roi": True, "roi_rows": 900},
    }
    for result in (in_process, helper, skipped, {**common, "row": "ceiling"}, by_region):
        gpu_train.print_row(result, flush=False)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5
    assert "lane 1000 bfloat16 rows" in printed[0] and "lane cost 20.0%" in printed[0]
    assert "by region" not in printed[0]
    assert "fell back 2, 900 by region, GPU 9000" in printed[4]
    assert "512 MiB, 7 nvJPEG allocations" in printed[0]
    assert "512 MiB, - nvJPEG allocations" in printed[1]
    assert "lane cost 0.0% of the GPU (0 quiet steps)" in printed[1]
    assert printed[2].endswith("skipped: nvidia.dali is not importable")


def test_without_a_cuda_gpu_it_says_so_and_exits_0(
    gpu_train: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["gpu_train.py", "--rows", "ceiling"])
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the script would measure")
    assert gpu_train.main() == 0
    assert "nothing to measure" in capsys.readouterr().out


@pytest.mark.parametrize(
    "script", ["fence_cost.py", "lane_profile.py", "nvjpeg_beside_training.py"]
)
def test_the_gpu_checks_scripts_say_there_is_nothing_to_measure_without_a_gpu(
    script: str, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the script would measure")
    (tmp_path / "a").mkdir()
    ran = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "gpu" / script), "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "no CUDA GPU here; nothing to measure" in ran.stdout


# Stands in for python3 on the scripts' PATH: pytest fails, everything else succeeds.
_FAKE_PYTHON = """#!/bin/sh
case "$*" in
    *"-m pytest"*) echo "1 failed"; exit 1 ;;
esac
cat > /dev/null
exit 0
"""


@pytest.mark.parametrize(
    ("script", "settings"),
    [
        ("decode_check.sh", {"SKIP_BENCH": "1"}),
        ("run.sh", {}),
        ("lane_levers.sh", {"NVJPEG_CONNECTIONS": "", "CONFIGS": ""}),
    ],
)
def test_a_gpu_check_whose_tests_fail_exits_with_their_status(
    script: str, settings: dict[str, str], tmp_path: Path
) -> None:
    """A device run reads as passed when its script exits 0: each step's output goes through
    tee, so a script that exited with tee's status passed whatever pytest said. Run here in a
    copy of the repository's layout, with a python3 whose pytest fails and every other step
    (install, smoke test, benchmarks, binaries) succeeding."""
    root = tmp_path / "repo"
    shutil.copytree(SCRIPT.parent / "gpu", root / "benches" / "gpu")
    (root / "python-client").mkdir()
    device = root / ".device"
    device.mkdir()
    (device / "stoker-0-py3-none-any.whl").write_bytes(b"")
    for name in ("stoker", "stoker-worker", "stoker-lane-helper"):
        (device / f"{name}.gz").write_bytes(gzip.compress(b"#!/bin/sh\nexit 0\n"))
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "python3").write_text(_FAKE_PYTHON)
    (fake / "python3").chmod(0o755)
    env = {
        **os.environ, **settings, "PATH": f"{fake}:{os.environ['PATH']}",
        "SCRATCH": str(tmp_path / "scratch"),
    }
    ran = subprocess.run(
        ["bash", str(root / "benches" / "gpu" / script)], capture_output=True, text=True,
        timeout=120, env=env, cwd=root,
    )
    assert ran.returncode == 1, (ran.returncode, ran.stdout[-2000:], ran.stderr[-2000:])
    assert "FAILED (exit 1): pytest -m gpu" in ran.stdout, ran.stdout[-2000:]


def test_the_end_memory_sample_of_a_dataloader_run_sees_its_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparisons read the run's PSS once its clock stops, the loader "still alive and at
    its fullest": a DataLoader's workers must still run then. Before, its iterator was asked
    once more at the epoch's end, and DataLoader ends its workers before it raises
    StopIteration: the end sample held the parent alone."""
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("measure", SCRIPT.parent / "measure.py")
    assert spec is not None and spec.loader is not None
    measure = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "measure", measure)  # its dataclasses look it up there
    spec.loader.exec_module(measure)
    dataset = torch.utils.data.TensorDataset(torch.zeros(32, 3), torch.arange(32))

    def build() -> object:
        return torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)

    before = set(measure.child_pids(os.getpid()))
    run = measure.timed_run(build, 0)
    assert (run.batches, run.images) == (8, 32)
    workers = set(measure.child_pids(os.getpid())) - before
    assert len(workers) == 2, workers
    del run
