"""The shared token and TLS from Python: ``token=`` and ``STOKER_TOKEN`` reach the client (a real
coordinator and worker started with ``--token-file`` serve it, and refuse it without), and
``tls_ca=`` makes the client speak TLS (a plaintext coordinator refuses it as such)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_distributed import _options

import stoker
from conftest import (
    assert_same_batches,
    epoch_batches,
    running_cluster,
    write_test_certificates,
)

TOKEN = "python-test-token-0123456789"


def _token_file(tmp_path: Path, text: str) -> Path:
    token_file = tmp_path / "token"
    token_file.write_text(text)
    token_file.chmod(0o600)
    return token_file


def _matches_local(dataset: Path, address: str, **security: str) -> None:
    """A remote loader with ``security`` reads the same epoch as the embedded one."""
    remote = stoker.Loader(dataset, address=address, **security, **_options(world_size=1))
    local = stoker.Loader(dataset, num_threads=1, **_options(world_size=1))
    try:
        assert_same_batches(epoch_batches(remote), epoch_batches(local))
    finally:
        remote.close()
        local.close()


@pytest.fixture
def guarded(dataset: Path, tmp_path: Path) -> Iterator[str]:
    """A coordinator and a worker that want ``TOKEN``; yields the coordinator's address."""
    security = ["--token-file", str(_token_file(tmp_path, TOKEN + "\n"))]
    with running_cluster(dataset, tmp_path / "state", security, security, workers=1) as address:
        yield address


def test_token_argument_is_presented(dataset: Path, guarded: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOKER_TOKEN", raising=False)
    _matches_local(dataset, guarded, token=TOKEN)


def test_stoker_token_environment_is_presented(dataset: Path, guarded: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_TOKEN", TOKEN)
    loader = stoker.Loader(dataset, address=guarded, **_options(world_size=1))
    try:
        assert next(iter(loader))["image"].shape[0] == 16
    finally:
        loader.close()


def test_missing_and_wrong_tokens_raise_authentication_error(
    dataset: Path, guarded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STOKER_TOKEN", raising=False)
    with pytest.raises(stoker.AuthenticationError, match="requires a token"):
        stoker.Loader(dataset, address=guarded, **_options(rank=0))
    with pytest.raises(PermissionError, match="not one this daemon accepts"):
        stoker.Loader(dataset, address=guarded, token="wrong", **_options(rank=0))


def test_tls_ca_makes_the_client_speak_tls(dataset: Path, guarded: str, tmp_path: Path) -> None:
    ca, _, _ = write_test_certificates(tmp_path, ["127.0.0.1"])
    with pytest.raises(stoker.TlsError, match="does not answer in TLS"):
        stoker.Loader(dataset, address=guarded, token=TOKEN, tls_ca=ca, **_options(rank=0))


def test_a_job_over_tls_with_a_token(dataset: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOKER_TOKEN", raising=False)
    ca, cert, key = write_test_certificates(tmp_path, ["localhost"])
    security = ["--token-file", str(_token_file(tmp_path, TOKEN)), "--tls-cert", cert, "--tls-key",
                key, "--tls-ca", ca, "--tls-server-name", "localhost"]
    with running_cluster(dataset, tmp_path / "state", security, security, workers=1) as address:
        _matches_local(dataset, address, token=TOKEN, tls_ca=ca, tls_server_name="localhost")


def test_security_arguments_need_the_distributed_mode(dataset: Path) -> None:
    with pytest.raises(ValueError, match="distributed mode only"):
        stoker.Loader(dataset, token=TOKEN, **_options(rank=0))
    with pytest.raises(ValueError, match="tls_server_name needs tls_ca"):
        stoker.Loader(dataset, address="127.0.0.1:1", tls_server_name="x", **_options(rank=0))
    with pytest.raises(TypeError, match="token must be a str"):
        stoker.Loader(dataset, address="127.0.0.1:1", token=b"bytes", **_options(rank=0))
    with pytest.raises(ValueError, match="token"):
        stoker.Loader(dataset, address="127.0.0.1:1", token="two words", **_options(rank=0))

