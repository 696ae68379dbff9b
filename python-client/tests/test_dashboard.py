"""The stall dashboard from Python: ``Loader(..., dashboard=port)`` serves the page, the JSON
API and Prometheus metrics for the loader's own figures, and stops with ``close()``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import stoker


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def test_dashboard_serves_the_loaders_figures(dataset: Path) -> None:
    loader = stoker.Loader(
        dataset, pipeline=stoker.vision.imagenet_train(32), batch_size=8, output="numpy",
        dashboard=0,
    )
    url = loader.dashboard_url
    assert url is not None and url.startswith("http://127.0.0.1:")
    batches = sum(1 for _ in loader)
    assert batches == len(loader)
    # The sampler reads the loader every 0.5 s.
    deadline = time.monotonic() + 10
    jobs: list[dict] = []
    while time.monotonic() < deadline:
        jobs = json.loads(_get(url.rstrip("/") + "/api/jobs"))["jobs"]
        if jobs and jobs[0]["current"] and jobs[0]["current"]["samples_total"] >= 120:
            break
        time.sleep(0.3)
    assert jobs, "the dashboard lists no job"
    job = jobs[0]
    assert job["name"] == dataset.name and job["rank"] == 0
    assert job["current"]["samples_total"] == 120
    assert "<canvas" in _get(url) or "dashboard.js" in _get(url)
    metrics = _get(url.rstrip("/") + "/metrics")
    assert "# TYPE stoker_stall_ratio gauge" in metrics
    assert f'stoker_samples_total{{job="{dataset.name}",rank="0"}} 120' in metrics
    loader.close()
    with pytest.raises(urllib.error.URLError):
        _get(url.rstrip("/") + "/api/jobs")


@pytest.mark.parametrize("bad", [-1, 70000, "nohost", ":80", "host:port"])
def test_bad_dashboard_addresses_are_refused(dataset: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="dashboard"):
        stoker.Loader(dataset, pipeline=stoker.vision.imagenet_train(32), batch_size=8,
                      dashboard=bad)  # type: ignore[arg-type]
