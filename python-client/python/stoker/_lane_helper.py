"""The ``stoker-lane-helper`` command the package installs: the GPU decode lane in a process of
its own, which a loader starts when ``STOKER_GPU_DECODE_HELPER`` asks for it (see
:func:`stoker.gpu.lane_helper`). It is the same helper as the Rust binary of that name, run
through the native module, and speaks to its loader over its stdin and stdout."""

from __future__ import annotations

import os
import sys

from stoker import _native


def lane_helper() -> str | None:
    """The ``stoker-lane-helper`` the loaders of this process start for ``decode="gpu"`` or
    ``"auto"``, as ``STOKER_GPU_DECODE_HELPER`` asks: None when it is unset, empty or ``0`` (the
    lane runs in the loader's process); for ``1``, the command found first in this
    installation's scripts folder, the user's scripts folder, the folder of
    ``sys.executable``, then on ``PATH``; else the path it names.

    Raises:
        ValueError: the binary it names, or for ``1`` finds, is not there.
    """
    found = _native.lane_helper()
    return None if found is None else os.fspath(found)


def main() -> None:
    """The command: serves one loader, then exits with the helper's status."""
    raise SystemExit(_native.lane_helper_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
