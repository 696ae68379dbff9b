"""Checks of the loaders' arguments, shared by :class:`~stoker.Loader` and
``Loader.from_dataset``: integers and flags in range, dataset sources, rank and world size (with
their defaults from torch.distributed or the environment), decode threads, the dashboard's
address and credential, prefetch, error policy, timeouts, output kind, formats, the remote
settings, DataLoader-only arguments (refused with what to use instead), and importing torch
when an output needs it. Every check runs before
any thread starts or any file is read, and names the argument it refuses.
"""

from __future__ import annotations

import errno
import importlib
import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeGuard

from stoker import _native

# DataLoader arguments with no Stoker meaning, and what to use instead.
DATALOADER_ONLY: Final[Mapping[str, str]] = {
    "num_workers": "use num_threads=N (decode threads in this process; no worker processes); "
    "Loader.from_dataset takes num_workers for a Python Dataset",
    "sampler": "use shuffle, seed, rank and world_size (the order is planned in Rust)",
    "batch_sampler": "use batch_size and drop_last (batches are planned in Rust)",
    "collate_fn": "batches are assembled in Rust as a dict of tensors; post-process them in "
    "the training loop (Loader.from_dataset takes collate_fn for a Python Dataset)",
    "pin_memory_device": "use device='cuda:N' (batches delivered on that GPU) or pin_memory=True "
    "(page-locked slots, registered for every device)",
    "worker_init_fn": "there are no worker processes; pipelines are declarative stoker.ops",
    "persistent_workers": "decode threads live as long as the Loader; close() stops them",
    "prefetch_factor": "use prefetch=N (batches in flight) or prefetch='auto'",
    "generator": "use seed=N (every random draw is seeded by seed, epoch and sample index)",
    "multiprocessing_context": "there are no worker processes",
    "in_order": "batches always come in step order, which makes runs reproducible",
    "dataset": "pass a dataset path as source, or wrap a map-style Dataset with "
    "Loader.from_dataset(dataset, ...)",
    "transform": "use pipeline=[stoker.ops...] or stoker.vision.imagenet_train() (a Python "
    "Dataset with its own transform: Loader.from_dataset(dataset, transform=...))",
}

# DataLoader arguments Loader.from_dataset has no use for, and what to do instead.
FROM_DATASET_ONLY: Final[Mapping[str, str]] = {
    "worker_init_fn": "worker processes run no init function (and "
    "torch.utils.data.get_worker_info() is None in them): open per-process resources lazily "
    "in __getitem__, e.g. a file opened on first use and kept in an attribute",
    "sampler": "use shuffle, seed, rank and world_size (the order is planned in Rust); for "
    "weighted sampling, stoker.mix over per-class subsets by weight",
    "batch_sampler": "use batch_size and drop_last (batches are planned in Rust)",
    "generator": "use seed=N, and stoker.sample_rng() for the dataset's own draws",
    "persistent_workers": "worker processes live as long as the Loader; close() stops them",
    "prefetch_factor": "use prefetch=N (batches in flight) or prefetch='auto'",
    "pin_memory_device": "use pin_memory=True (page-locked slots, registered for every "
    "device)",
    "in_order": "batches always come in step order, which makes runs reproducible",
}


def refuse_unexpected_for_dataset(unsupported: Mapping[str, Any]) -> None:
    """Refuses keyword arguments :meth:`~stoker.Loader.from_dataset` does not take: a
    DataLoader one with a ValueError naming what to use instead, any other with a TypeError."""
    for name in unsupported:
        if name in FROM_DATASET_ONLY:
            raise ValueError(
                f"Loader.from_dataset does not take DataLoader's {name}=: "
                f"{FROM_DATASET_ONLY[name]}"
            )
    if unsupported:
        names = ", ".join(sorted(unsupported))
        raise TypeError(f"Loader.from_dataset got unexpected keyword argument(s): {names}")


# The ranges of the native side's integer arguments.
MAX_U32: Final = 2**32 - 1
MAX_U64: Final = 2**64 - 1
# The most ranks a job has: past any cluster, and a saved state claiming more (its steps are
# held per rank) is not one a loader wrote.
MAX_WORLD_SIZE: Final = 2**20


def is_int(value: object) -> TypeGuard[int]:
    # numpy's integers count; bool, an int subclass, does not.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value: object, name: str, low: int, high: int) -> int:
    if not is_int(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in {low}..={high}, got {value!r}")
    return int(value)


def check_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def is_pattern(path: str) -> bool:
    """Whether a source name is read as a pattern: a glob (``*``, ``?``, ``[...]``) or brace
    groups (``{00000..01023}``, ``{a,b}``). A name that exists as written is taken as written."""
    return any(c in path for c in "*?[{}")


def source_names(source: object, locate: Callable[[object], str]) -> list[str]:
    """The names ``source`` gives, each through ``locate``: one path, URI or pattern, or a
    non-empty list or tuple of them (read as one source)."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("source must not be an empty list")
        return [locate(each) for each in source]
    return [locate(source)]


def check_split(split: object) -> str:
    """A split's name ("" for None)."""
    if split is None:
        return ""
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"split must be a split's name such as 'train', got {split!r}")
    return split.strip()


def remote_source_path(source: object) -> str:
    """``source`` as the workers will open it: a local path that exists here is made absolute
    (workers resolve relative paths against their own working directory)."""
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"source must be a path (str or os.PathLike), got {source!r}")
    path = os.fspath(source)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise ValueError("source must not be empty")
    if "://" not in path and (os.path.exists(path) or is_pattern(path)):
        path = os.path.abspath(path)
    return path


def source_path(source: object) -> str:
    """The dataset ``source`` names: a local path (``file://`` URLs accepted, and checked to
    exist here; a Megatron corpus's prefix, its ``.bin`` and ``.idx`` beside it, is one) or an
    ``s3://BUCKET/PREFIX`` URI (checked when the loader opens it)."""
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(
            "source must be a path (str or os.PathLike) or an s3://BUCKET/PREFIX URI, "
            f"got {source!r}"
        )
    path = os.fspath(source)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        scheme = path.split("://", 1)[0]
        if scheme.lower() == "s3":
            return path
        raise ValueError(
            f"source {path!r}: {scheme}:// sources are not supported; pass a local path, "
            "a file:// URL or an s3://BUCKET/PREFIX URI"
        )
    if not path:
        raise ValueError("source must not be empty")
    megatron_prefix = os.path.isfile(path + ".bin") and os.path.isfile(path + ".idx")
    if not os.path.exists(path) and not is_pattern(path) and not megatron_prefix:
        raise FileNotFoundError(errno.ENOENT, f"source {path!r} does not exist", path)
    return path


def distributed_defaults() -> tuple[int | None, int | None, str]:
    """(rank, world_size, where they came from), from torch.distributed or the environment."""
    # Only look at torch.distributed when it is already imported: initialising it needs the
    # import, and importing torch just to find it uninitialised costs seconds.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed"
    values: list[int | None] = []
    for variable in ("RANK", "WORLD_SIZE"):
        text = os.environ.get(variable)
        if text is None or text.strip() == "":
            values.append(None)
            continue
        try:
            values.append(int(text))
        except ValueError:
            raise ValueError(
                f"environment variable {variable}={text!r} is not an int; fix it or pass "
                f"{variable.lower()}= to Loader"
            ) from None
    return values[0], values[1], "the RANK / WORLD_SIZE environment variables"


# Where rank 0 of 1 comes from when nothing gives a rank or world size.
_NO_DEFAULTS: Final = "the default, no torch.distributed or RANK / WORLD_SIZE being set"


def resolve_rank(rank: object, world_size: object) -> tuple[int, int, str]:
    """Explicit values first, then torch.distributed / the environment, then 0 of 1; with
    where they came from ("" when both were passed).

    The two come from one place: a rank given alone is paired with the default world size
    only where the defaults give this very rank (and a world size alone likewise), and the
    environment must give both RANK and WORLD_SIZE or neither. Otherwise every process of a
    job would read as one rank (all rank 0 of N: the same share read N times, the rest
    never), so it is a ValueError saying what to pass."""
    if rank is not None and world_size is not None:
        return (*_checked_rank(rank, "", world_size, ""), "")
    default_rank, default_world, origin = distributed_defaults()
    if rank is None and world_size is None:
        if default_rank is None and default_world is None:
            return 0, 1, _NO_DEFAULTS
        if default_rank is None and default_world == 1:
            return 0, 1, f"from {origin}"  # one process: rank 0 is the only one
        if default_rank is None or default_world is None:
            present = "WORLD_SIZE" if default_rank is None else "RANK"
            missing = "RANK" if default_rank is None else "WORLD_SIZE"
            raise ValueError(
                f"the environment sets {present}={os.environ.get(present)!r} but not {missing}, so "
                "this process's share of the data is unknown (every process would read as "
                "rank 0). Launchers that set only LOCAL_RANK/NODE_RANK before starting "
                "torch.distributed (PyTorch Lightning's) need the loader built after it "
                "starts (in train_dataloader()), or rank= and world_size= passed"
            )
        suffix = f" (from {origin})"
        return (*_checked_rank(default_rank, suffix, default_world, suffix), f"from {origin}")
    # One of the two given: paired with the defaults only where they agree with it.
    if world_size is not None and is_int(world_size) and world_size == 1:
        return 0, 1, ""  # one rank: there is no other to pair it with (a rank-0-only loader)
    if default_rank is None and default_world is None:
        if world_size is not None and check_int(world_size, "world_size", 1, MAX_WORLD_SIZE) > 1:
            raise ValueError(
                f"world_size={world_size!r} was given without rank=, and neither "
                "torch.distributed nor the RANK environment variable gives one: pass rank= "
                "too (every process would otherwise read as rank 0)"
            )
        checked = _checked_rank(0 if rank is None else rank, "",
                                1 if world_size is None else world_size, "")
        return (*checked, _NO_DEFAULTS)
    given_name, given = ("rank", rank) if rank is not None else ("world_size", world_size)
    default_given = default_rank if rank is not None else default_world
    if default_rank is not None and default_world is not None and given == default_given:
        suffix = f" (from {origin})"
        return (*_checked_rank(default_rank, suffix, default_world, suffix), f"from {origin}")
    raise ValueError(
        f"{given_name}={given!r} was given alone, and the defaults ({origin}) are rank "
        f"{_or_unset(default_rank)} of world size {_or_unset(default_world)}: pass rank= "
        "and world_size= together (a data-parallel rank and size of their own, as with "
        "tensor or pipeline parallelism, are both needed)"
    )


def _or_unset(value: int | None) -> str:
    return "unset" if value is None else str(value)


def _checked_rank(rank: object, rank_origin: str, world_size: object,
                  world_origin: str) -> tuple[int, int]:
    world = check_int(world_size, f"world_size{world_origin}", 1, MAX_WORLD_SIZE)
    rank_ = check_int(rank, f"rank{rank_origin}", 0, MAX_U32)
    if rank_ >= world:
        raise ValueError(
            f"rank {rank_}{rank_origin} is out of range for world_size {world}{world_origin}: "
            f"it must be in 0..{world}"
        )
    return rank_, world


def default_threads() -> tuple[int, str]:
    """Decode threads for ``num_threads=None`` and the rule that chose them (0: every CPU the
    native side finds available, which honours affinity and cgroup quota)."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    try:
        local_world = int(text) if text else 1
    except ValueError:
        raise ValueError(
            f"environment variable LOCAL_WORLD_SIZE={text!r} is not an int; fix it or pass "
            "num_threads="
        ) from None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    node = os.cpu_count()
    if local_world > 1 and affinity is not None and node is not None and affinity >= node:
        # The affinity alone does not see a cgroup quota (a pod limited to 8 CPUs of 96).
        available = min(affinity, _native.available_threads())
        return (
            max(1, available // local_world),
            f"{available} CPUs available to the node's ranks (affinity and cgroup quota) "
            f"divided by LOCAL_WORLD_SIZE={local_world}",
        )
    if local_world > 1:
        return 0, f"the {affinity} CPUs of this rank's affinity (already split by the launcher)"
    return 0, "the CPUs available to this process"


def import_torch(reason: str) -> Any:
    # Imported by name, so a type check without torch installed passes too.
    try:
        torch = importlib.import_module("torch")
    except ImportError as error:
        raise ImportError(
            f"{reason} needs PyTorch, which cannot be imported ({error}); install it "
            "(pip install 'stoker[torch]' or see pytorch.org) or pass output='numpy'"
        ) from error
    return torch


def torch_importable() -> bool:
    try:
        importlib.import_module("torch")
    except ImportError:
        return False
    return True


def dashboard_credential_path(
    dashboard: int | str | None, token_file: str | os.PathLike[str] | None
) -> str | None:
    """``dashboard_token_file=`` as the native side wants it, checked against ``dashboard=``."""
    if token_file is None:
        return None
    if dashboard is None:
        raise ValueError("dashboard_token_file needs dashboard= (the address to serve on)")
    if not isinstance(token_file, (str, os.PathLike)):
        raise TypeError(f"dashboard_token_file must be a path, got {token_file!r}")
    return os.fspath(token_file)


def dashboard_address(dashboard: int | str | None) -> str | None:
    """``dashboard=`` as the native side wants it: a port serves on 127.0.0.1."""
    if dashboard is None:
        return None
    if isinstance(dashboard, bool):
        raise TypeError("dashboard must be a port (int) or 'host:port' (str), not bool")
    if isinstance(dashboard, int):
        if not 0 <= dashboard <= 65535:
            raise ValueError(
                f"dashboard port must be in 0..65535 (0: any free port), got {dashboard}"
            )
        return f"127.0.0.1:{dashboard}"
    if isinstance(dashboard, str):
        host, sep, port = dashboard.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"dashboard must be a port or 'host:port', got {dashboard!r}")
        return dashboard
    raise TypeError(
        f"dashboard must be a port (int) or 'host:port' (str), got {type(dashboard).__name__}"
    )


# Dataset formats a source may name (None: picked from the files).
FORMATS: Final = ("image_folder", "tar", "parquet", "tokens", "jsonl", "hf", "mds")


def check_prefetch(prefetch: object) -> int:
    """``prefetch`` as the native side takes it: 0 for ``"auto"``, else 1..=4096."""
    if prefetch == "auto":
        return 0
    if is_int(prefetch) and 1 <= prefetch <= 4096:
        return int(prefetch)
    raise ValueError(f"prefetch must be 'auto' or an int in 1..=4096, got {prefetch!r}")


def check_on_error(on_error: object) -> Literal["skip", "fail"]:
    """``on_error``: ``"skip"`` or ``"fail"``."""
    if on_error == "skip":
        return "skip"
    if on_error == "fail":
        return "fail"
    raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")


# The longest wait taken (about 31 years): longer ones do not fit the native clock's
# arithmetic, and mean "never" anyway.
MAX_SECONDS: Final = 1e9


def check_seconds(value: object, name: str) -> float:
    """A positive, finite number of seconds, at most ``MAX_SECONDS``."""
    # numpy's numbers count; bool, an int subclass, does not.
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    seconds = float(value) if real else None  # type: ignore[arg-type]
    if seconds is None or not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise ValueError(
            f"{name} must be a positive number of seconds up to {MAX_SECONDS:.0e}, got {value!r}"
        )
    return seconds


def resolve_output(output: object) -> Literal["torch", "numpy"]:
    """``output``: ``"torch"`` or ``"numpy"``; None picks torch when it can be imported."""
    if output is None:
        return "torch" if torch_importable() else "numpy"
    if output == "torch":
        return "torch"
    if output == "numpy":
        return "numpy"
    raise ValueError(
        f"output must be 'torch' or 'numpy' (None: torch when importable), got {output!r}"
    )


def check_format(format: object, whose: str = "format") -> str:
    """A source's format: one of :data:`FORMATS`, or ``"auto"`` for None."""
    if format is None or format == "auto":
        return "auto"
    if format not in FORMATS:
        raise ValueError(
            f"{whose} must be None (pick it from the files) or one of "
            f"{', '.join(repr(f) for f in FORMATS)}, got {format!r}"
        )
    return str(format)


def check_text_column(text_column: object, whose: str = "text_column") -> str:
    """A text (or label) column's name ("" for None)."""
    if text_column is not None and not isinstance(text_column, str):
        raise ValueError(f"{whose} must be a str or None, got {text_column!r}")
    return text_column or ""


def check_remote(
    address: object, token: object, tls_ca: object, tls_server_name: object
) -> None:
    """A coordinator's ``host:port`` (or a fleet's, comma-separated) and the settings that
    apply only with one: the token (a str), and ``tls_server_name`` only beside ``tls_ca``."""
    if address is not None and (
        not isinstance(address, str)
        or ":" not in address
        or "://" in address
        or address.strip() != address
    ):
        raise ValueError(
            "address must be 'host:port' of a Stoker coordinator (or a comma-separated list "
            f"of a fleet's), got {address!r}"
        )
    if address is None and (token, tls_ca, tls_server_name) != (None, None, None):
        raise ValueError(
            "token, tls_ca and tls_server_name apply to the distributed mode only: "
            "give address='host:port' of a coordinator"
        )
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str, got {type(token).__name__}")
    if tls_server_name is not None and tls_ca is None:
        raise ValueError(
            "tls_server_name needs tls_ca (the CA that signed the daemons' certificates)"
        )


def refuse_unexpected(unsupported: Mapping[str, Any]) -> None:
    """Refuses keyword arguments :class:`~stoker.Loader` does not take: a DataLoader-only one
    with a ValueError naming what to use instead, any other with a TypeError."""
    for name in unsupported:
        if name in DATALOADER_ONLY:
            raise ValueError(f"Loader does not take DataLoader's {name}=: {DATALOADER_ONLY[name]}")
    if unsupported:
        names = ", ".join(sorted(unsupported))
        raise TypeError(f"Loader got unexpected keyword argument(s): {names}")
