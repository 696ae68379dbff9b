"""The ``stoker-lane-helper`` command the package installs (the GPU decode lane in a process of
its own, run through the native module), where no GPU is needed: found by
``STOKER_GPU_DECODE_HELPER=1``, and speaking the helper's messages over its stdin and stdout as
the Rust binary does (its test hook answering every image for the CPU). Its messages are
written and read here by hand, field by field, as ``proto/stoker/v1/lane_helper.proto`` numbers
them; the rows it builds on a GPU are ``test_gpu_decode.py``'s."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

import stoker.gpu

COMMAND = Path(sysconfig.get_path("scripts")) / "stoker-lane-helper"
HELPER_PROTOCOL = 3  # gpu/src/decode/helper/wire.rs


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint, or length-delimited bytes (a message or a string)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _fields(data: bytes) -> dict[int, list[int | bytes]]:
    """A message's fields by number (varints and length-delimited ones, which is all the
    helper's replies hold)."""
    found: dict[int, list[int | bytes]] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = varint()
        if key & 7 == 0:
            found.setdefault(key >> 3, []).append(varint())
        elif key & 7 == 2:
            length = varint()
            found.setdefault(key >> 3, []).append(data[at : at + length])
            at += length
        else:
            raise AssertionError(f"wire type {key & 7} in a helper's reply")
    return found


def _send(helper: subprocess.Popen[bytes], message: bytes) -> None:
    assert helper.stdin is not None
    helper.stdin.write(struct.pack("<I", len(message)) + message)
    helper.stdin.flush()


def _reply(helper: subprocess.Popen[bytes]) -> dict[int, list[int | bytes]]:
    """The next reply: the fields of its one kind, keyed by the kind's number as well (1: a
    start's answer, 2: a batch's)."""
    assert helper.stdout is not None
    (length,) = struct.unpack("<I", helper.stdout.read(4))
    outer = _fields(helper.stdout.read(length))
    (kind,) = outer
    (body,) = outer[kind]
    assert isinstance(body, bytes)
    return {0: [kind], **_fields(body)}


def _start(protocol: int) -> bytes:
    """A loader's start (a request of kind 1) for 224x224 rows in batches of 8, uint8 NHWC."""
    tail = b""  # element 0 (uint8), not planar, no scale: every field its default
    start = (
        _field(1, protocol)
        + _field(3, 1 << 30)
        + _field(4, 224)
        + _field(5, 224)
        + _field(6, 8)
        + _field(9, tail)
    )
    return _field(1, start)


def _helper(**env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(COMMAND)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )


def _ended(helper: subprocess.Popen[bytes]) -> tuple[int, str]:
    """Closes the helper's stdin and waits for it to end (reading what it still writes): its
    exit status and stderr."""
    _, stderr = helper.communicate(timeout=60)
    return helper.returncode, stderr.decode()


def test_the_package_installs_the_helper_where_one_asks_it_to_be_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert COMMAND.is_file(), "the package's install put no stoker-lane-helper command"
    # Found where the installation keeps its commands, whatever PATH holds.
    monkeypatch.setenv("PATH", "")
    for off in ("", "0", " 0 "):
        monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", off)
        assert stoker.gpu.lane_helper() is None
    monkeypatch.delenv("STOKER_GPU_DECODE_HELPER")
    assert stoker.gpu.lane_helper() is None
    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", "1")
    assert stoker.gpu.lane_helper() == str(COMMAND)
    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", str(COMMAND))
    assert stoker.gpu.lane_helper() == str(COMMAND)
    monkeypatch.setenv("STOKER_GPU_DECODE_HELPER", "/no/such/helper")
    with pytest.raises(ValueError, match="STOKER_GPU_DECODE_HELPER=/no/such/helper: not a file"):
        stoker.gpu.lane_helper()


def test_the_command_serves_a_loader_as_the_helper_binary_does() -> None:
    helper = _helper(STOKER_LANE_HELPER_NO_DEVICE="1")
    _send(helper, _start(HELPER_PROTOCOL))
    started = _reply(helper)
    assert started[0] == [1]
    assert 1 not in started, f"the start was refused: {started[1]!r}"
    assert started[2] == [helper.pid]
    assert 3 not in started  # no device
    assert started[12] == [b"uint8"]
    for batch in (7, 8):
        images = b"".join(
            _field(3, _field(1, row) + _field(2, 100 + row) + _field(3, b"\xff\xd8\xff\xd9"))
            for row in (0, 2, 4)
        )
        _send(helper, _field(2, _field(1, batch) + _field(2, 1) + images))
        built = _reply(helper)
        assert built[0] == [2]
        assert built[1] == [batch]
        assert built[2] == [1]
        assert 3 not in built  # no device rows
        cpu = [_fields(row) for row in built[4] if isinstance(row, bytes)]
        # (row 0 is field 1's default, which protobuf leaves out.)
        assert [(row.get(1, [0]), row[2], 3 in row) for row in cpu] == [
            ([0], [100], False),
            ([2], [102], False),
            ([4], [104], False),
        ]
    code, stderr = _ended(helper)
    assert code == 0, stderr


def test_the_command_refuses_what_the_binary_refuses() -> None:
    helper = _helper(STOKER_LANE_HELPER_NO_DEVICE="1")
    _send(helper, _start(HELPER_PROTOCOL + 98))
    refused = _reply(helper)
    assert refused[0] == [1]
    error = refused[1][0]
    assert isinstance(error, bytes)
    expected = f"the loader speaks the helper's protocol {HELPER_PROTOCOL + 98}, this helper "
    assert (expected + str(HELPER_PROTOCOL)).encode() in error
    code, stderr = _ended(helper)
    assert code == 0, stderr
    # A message out of step ends it with a failure, said on stderr.
    helper = _helper(STOKER_LANE_HELPER_NO_DEVICE="1")
    _send(helper, _field(2, _field(1, 7)))
    code, stderr = _ended(helper)
    assert code == 1
    assert "the first message was not a start" in stderr
    # Arguments: none taken.
    taken = subprocess.run(
        [str(COMMAND), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert taken.returncode == 2
    assert "stoker-lane-helper takes no arguments" in taken.stderr


def test_what_else_the_process_prints_goes_to_stderr_not_into_the_messages(
    tmp_path: Path,
) -> None:
    # The command's process with Python code printing on stdout while the helper serves
    # (once the helper has answered its start, so after it set stdout apart).
    flag = tmp_path / "print-now"
    script = (
        "import os, sys, threading, time\n"
        "from stoker import _native\n"
        "def noise():\n"
        f"    while not os.path.exists({str(flag)!r}):\n"
        "        time.sleep(0.001)\n"
        "    while True:\n"
        "        print('noise on stdout', flush=True)\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=noise, daemon=True).start()\n"
        "raise SystemExit(_native.lane_helper_main([]))\n"
    )
    helper = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "STOKER_LANE_HELPER_NO_DEVICE": "1"},
    )
    _send(helper, _start(HELPER_PROTOCOL))
    assert _reply(helper)[0] == [1]
    flag.touch()
    time.sleep(0.05)
    for batch in range(20):
        _send(helper, _field(2, _field(1, batch) + _field(3, _field(2, 7))))
        built = _reply(helper)
        assert built[0] == [2]
        assert built.get(1, [0]) == [batch]
        time.sleep(0.002)
    code, stderr = _ended(helper)
    assert code == 0, stderr
    assert "noise on stdout" in stderr
