"""What a loader becomes in a child process made by ``fork()``: its native threads exist only
in the parent, so in the child it refuses to be used, with an error saying why, and its native
handle is never dropped there (dropping it would join threads that are not there, and could
wait forever on a lock one of them held at the fork).
"""

from __future__ import annotations

import ctypes
import os
import weakref

from stoker.errors import StokerError

__all__ = ["ForkGuard"]

# The guards of every open loader, so a fork can mark them all in the child.
_GUARDS: weakref.WeakSet[ForkGuard] = weakref.WeakSet()


class ForkGuard:
    """Tells whether this process is the one that made a loader: made with the loader (by
    ``Loader`` before its native handle, so a failing constructor leaves one), given the handle
    by :meth:`hold`, and let go by :meth:`release` when the loader closes."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        #: Whether this process is a child that inherited the loader by fork().
        self.forked = False
        self._handle: object = None
        _GUARDS.add(self)

    def hold(self, handle: object) -> None:
        """The native handle to keep alive, undropped, in a forked child."""
        self._handle = handle

    def release(self) -> None:
        """The loader closed: a child forked from now on finds it closed, not inherited."""
        _GUARDS.discard(self)

    def refuse(self) -> None:
        """Raises a :class:`~stoker.StokerError` when the loader was inherited by fork()."""
        if self.forked:
            raise StokerError(
                f"this Loader was made in process {self.pid} and inherited by fork(); its "
                "decode threads did not survive the fork, so it cannot be used here. Make the "
                "Loader in the child process (e.g. after the fork, or with the 'spawn' start "
                "method)"
            )

    def _inherited(self) -> None:
        self.forked = True
        if self._handle is not None:
            # A reference the interpreter does not know about (it clears module globals at
            # exit, so a list would not do) keeps the handle's destructor from ever running.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._handle))


def _after_fork_in_child() -> None:
    for guard in list(_GUARDS):
        guard._inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
