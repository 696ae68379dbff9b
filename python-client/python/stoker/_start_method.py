"""How ``from_dataset``'s worker processes start: the start method (the program's own, else
fork on Linux), a main module a fresh interpreter cannot run again kept from being asked to,
a fork server's preloads, and which part of a dataset's state does not pickle."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker._samples import State

__all__ = ["main_not_rerun", "start_context", "unpicklable_part"]


def unpicklable_part(state: State) -> str:
    """Which part of ``state`` does not pickle: the transform (a lambda, say) or the dataset."""
    if state.transform is not None:
        try:
            pickle.dumps(state.transform, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return "transform"
    return "dataset"


def _default_start_method() -> str:
    """The program's own choice when it set one (``multiprocessing.set_start_method``), as
    DataLoader takes it; else fork on Linux: the workers start before any of the loader's own
    threads, in milliseconds, sharing the parent's pages. Elsewhere fork is unsafe (macOS's
    system libraries) or missing: forkserver where there is one, else spawn."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    if chosen is not None:
        return chosen
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and "fork" in methods:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _main_reimportable() -> bool:
    """Whether a fresh interpreter can run the main module again, as spawn and forkserver do
    to find what it defines: not when it came from stdin (``python -``), from ``python -c``
    or an interactive session (a notebook's too), which have no file to run."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    return path is not None and os.path.isfile(path)


@contextlib.contextmanager
def main_not_rerun(context: Any) -> Iterator[None]:
    """Starts a spawn or forkserver worker without asking it to run a main module that
    cannot be run again (a script read from stdin has ``__file__ == "<stdin>"``, which the
    child would look for as a file and die on)."""
    main = sys.modules.get("__main__")
    if context.get_start_method() == "fork" or main is None or _main_reimportable():
        yield
        return
    path = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path


def start_context(name: object, dataset: Any) -> Any:
    """The start method's context (default: :func:`_default_start_method`); a fork server
    preloads the dataset's module (and with it torch or torchvision), so its workers start
    without importing them again."""
    if name is None:
        name = _default_start_method()
    # A context object, as DataLoader takes it: multiprocessing.get_context("spawn").
    if isinstance(name, multiprocessing.context.BaseContext):
        name = name.get_start_method()
    if name not in ("spawn", "forkserver", "fork"):
        raise ValueError(
            f"multiprocessing_context must be 'forkserver', 'spawn' or 'fork', got {name!r}"
        )
    if name != "fork" and type(dataset).__module__ == "__main__" and not _main_reimportable():
        raise ValueError(
            f"multiprocessing_context={name!r} starts a fresh interpreter, which cannot load "
            f"the dataset: its class {type(dataset).__name__} is defined in a main module that "
            "cannot be run again (a script read from stdin or given to python -c, or an "
            "interactive session). Use "
            "multiprocessing_context='fork', or define the class in a module"
        )
    context = multiprocessing.get_context(str(name))
    if name == "forkserver":
        module = type(dataset).__module__
        preload = ["stoker._dataset"] + ([module] if module not in ("__main__", "builtins") else [])
        # Takes effect when this process starts its fork server, i.e. the first time.
        context.set_forkserver_preload(preload)
    return context
