"""The stall dashboard from Python: ``Loader(..., dashboard=port)`` serves the page, the JSON
API and Prometheus metrics for the loader's own figures, and stops with ``close()``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from email.message import Message
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
    assert f'stoker_samples_total{{stoker_job="{dataset.name}",rank="0"}} 120' in metrics
    loader.close()
    with pytest.raises(urllib.error.URLError):
        _get(url.rstrip("/") + "/api/jobs")


def _samples_charted(url: str, at_least: int) -> int:
    """The samples the dashboard's one job shows, once at least ``at_least`` (10 s at most)."""
    deadline, samples = time.monotonic() + 10, 0
    while time.monotonic() < deadline:
        jobs = json.loads(_get(url.rstrip("/") + "/api/jobs"))["jobs"]
        samples = (jobs[0]["current"] or {}).get("samples_total", 0) if jobs else 0
        if samples >= at_least:
            break
        time.sleep(0.3)
    return samples


def test_an_epoch_resumed_on_another_world_size_is_charted(dataset: Path) -> None:
    """The loader serving an epoch resumed on another world size is the one charted while it
    serves it (the plain one, which built nothing then, was), and the plain one again after;
    both count into one set of figures, which ``stats()`` reads too (it read the plain
    loader's alone, which did not move during the resized epoch)."""
    options: dict = {"pipeline": stoker.vision.imagenet_eval(32), "batch_size": 8,
                     "output": "numpy", "seed": 3}
    with stoker.Loader(dataset, rank=0, world_size=2, **options) as old:
        it = iter(old)
        next(it), next(it)
        state = old.state_dict()
    with stoker.Loader(dataset, rank=0, world_size=3, dashboard=0, **options) as loader:
        loader.load_state_dict(state)
        url = loader.dashboard_url
        assert url is not None
        resumed = sum(len(batch["label"]) for batch in loader)
        assert resumed > 0
        assert _samples_charted(url, resumed) == resumed
        assert loader.stats()["samples"] == resumed
        # The next epoch is the plain loader's, charted on from there.
        plain = sum(len(batch["label"]) for batch in loader)
        assert _samples_charted(url, resumed + plain) == resumed + plain
        assert loader.stats()["samples"] == resumed + plain


def test_a_dashboard_address_may_name_its_host(dataset: Path) -> None:
    # "host:port" as the docs say: "localhost:0" was refused as not host:port.
    with stoker.Loader(dataset, pipeline=stoker.vision.imagenet_eval(32), batch_size=8,
                       dashboard="localhost:0") as loader:
        assert loader.dashboard_url is not None
        assert loader.dashboard_url.startswith("http://127.0.0.1:"), loader.dashboard_url


@pytest.mark.parametrize("bad", [-1, 70000, "nohost", ":80", "host:port"])
def test_bad_dashboard_addresses_are_refused(dataset: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="dashboard"):
        stoker.Loader(dataset, pipeline=stoker.vision.imagenet_train(32), batch_size=8,
                      dashboard=bad)  # type: ignore[arg-type]


class _Squares:
    """A tiny map-style dataset for ``Loader.from_dataset``."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return index * index


def _answer(url: str, headers: dict[str, str] | None = None) -> tuple[int, Message]:
    """Status and headers (looked up in any case) of ``GET url``, redirects not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as error:
        return error.code, error.headers


def test_a_dashboard_off_loopback_needs_a_credential(dataset: Path, tmp_path: Path) -> None:
    options = {"pipeline": stoker.vision.imagenet_train(32), "batch_size": 8, "output": "numpy"}
    with pytest.raises(ValueError, match=r"0\.0\.0\.0:0 .*needs a dashboard credential"):
        stoker.Loader(dataset, dashboard="0.0.0.0:0", **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a dashboard credential"):
        stoker.Loader.from_dataset(_Squares(), batch_size=4, output="numpy",
                                   dashboard="0.0.0.0:0")
    with pytest.raises(ValueError, match="dashboard_token_file needs dashboard="):
        stoker.Loader(dataset, dashboard_token_file=tmp_path / "x", **options)  # type: ignore[arg-type]

    credential = "python-dashboard-credential-42"
    token_file = tmp_path / "dashboard-token"
    token_file.write_text(credential + "\n")
    token_file.chmod(0o600)
    loader = stoker.Loader(dataset, dashboard="0.0.0.0:0", dashboard_token_file=token_file,
                           **options)  # type: ignore[arg-type]
    try:
        url = loader.dashboard_url
        assert url is not None
        local = "http://127.0.0.1:" + url.rstrip("/").rsplit(":", 1)[1]
        assert _answer(local + "/")[0] == 401
        assert _answer(local + "/metrics", {"Authorization": "Bearer wrong"})[0] == 401
        assert _answer(local + "/metrics", {"Authorization": f"Bearer {credential}"})[0] == 200
        status, headers = _answer(local + f"/?token={credential}")
        assert status == 303
        cookie = headers.get("Set-Cookie", "")
        parts = cookie.split("; ")
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(parts), parts
        assert any(part.startswith("Max-Age=") for part in parts), parts
        assert credential not in cookie
        assert _answer(local + "/api/jobs", {"Cookie": parts[0]})[0] == 200
        # The redirect stays on this dashboard (`//host/` was a link to another site) and
        # leaves the credential out of the URL however its name is spelt (`tok%65n=`).
        status, headers = _answer(local + f"//evil.example/x?token={credential}")
        assert (status, headers.get("Location")) == (303, "/evil.example/x")
        status, headers = _answer(local + f"/?tok%65n={credential}&a=1")
        assert (status, headers.get("Location")) == (303, "/?a=1")
    finally:
        loader.close()


def test_a_loader_failing_late_in_its_making_lets_its_port_go(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"pipeline": stoker.vision.imagenet_train(32), "batch_size": 8, "output": "numpy"}
    first = stoker.Loader(dataset, dashboard=0, **options)  # type: ignore[arg-type]
    url = first.dashboard_url
    assert url is not None
    address = url.removeprefix("http://").rstrip("/")
    first.close()

    def fails(*_: object) -> None:
        raise RuntimeError("failed after the native loader was made")

    monkeypatch.setattr(stoker._loader, "BatchFeed", fails)
    # The traceback pytest keeps holds the half-made loader; its port must be free anyway.
    with pytest.raises(RuntimeError, match="after the native loader") as failure:
        stoker.Loader(dataset, dashboard=address, **options)  # type: ignore[arg-type]
    monkeypatch.undo()
    again = stoker.Loader(dataset, dashboard=address, **options)  # type: ignore[arg-type]
    assert again.dashboard_url == url
    again.close()
    del failure


def test_a_loopback_dashboard_given_a_credential_asks_for_it(
    dataset: Path, tmp_path: Path
) -> None:
    """Behind a proxy on the machine, a loopback dashboard given a credential must ask for it:
    before, any request was served and the credential silently ignored."""
    options = {"pipeline": stoker.vision.imagenet_train(32), "batch_size": 8, "output": "numpy"}
    credential = "loopback-dashboard-credential-7"
    token_file = tmp_path / "dashboard-token"
    token_file.write_text(credential + "\n")
    token_file.chmod(0o600)
    with stoker.Loader(dataset, dashboard=0, dashboard_token_file=token_file,
                       **options) as loader:  # type: ignore[arg-type]
        url = loader.dashboard_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert _answer(url.rstrip("/") + "/api/jobs")[0] == 401
        bearer = {"Authorization": f"Bearer {credential}"}
        assert _answer(url.rstrip("/") + "/api/jobs", bearer)[0] == 200
        # A request naming another host (a DNS-rebinding page) is refused, credential or not.
        rebound = {**bearer, "Host": "evil.example"}
        assert _answer(url.rstrip("/") + "/api/jobs", rebound)[0] == 403


def test_a_dashboard_credential_equal_to_the_distributed_token_is_refused(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RPC token opens jobs and their data; the dashboard's page, served in plain HTTP,
    must not take it as its credential. Refused before any coordinator is reached."""
    token_file = tmp_path / "dashboard-token"
    token_file.write_text("one-secret-for-both\n")
    token_file.chmod(0o600)
    started = time.monotonic()
    with pytest.raises(ValueError, match="holds the distributed mode's token"):
        stoker.Loader(str(dataset), address="127.0.0.1:9", token="one-secret-for-both",
                      dashboard=0, dashboard_token_file=token_file, batch_size=8,
                      pipeline=stoker.vision.imagenet_train(32), worker_grace=30)
    assert time.monotonic() - started < 10
    # The token the client sends from STOKER_TOKEN, token= not given: the same.
    monkeypatch.setenv("STOKER_TOKEN", "one-secret-for-both")
    with pytest.raises(ValueError, match="holds the distributed mode's token"):
        stoker.Loader(str(dataset), address="127.0.0.1:9", dashboard=0,
                      dashboard_token_file=token_file, batch_size=8,
                      pipeline=stoker.vision.imagenet_train(32), worker_grace=30)
    assert time.monotonic() - started < 20
