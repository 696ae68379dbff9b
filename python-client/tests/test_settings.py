"""The loader's settings are written once: the dataclasses of ``stoker._settings`` are what the
native loader reads (its own list of the fields, ``_native.SETTINGS_FIELDS``, agrees), the
stub takes them whole, and every argument of ``Loader`` and ``Loader.from_dataset`` is
documented where a user reads it."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import stoker
from stoker import _native, _settings

SETTINGS = {
    "LoaderSettings": _settings.LoaderSettings,
    "SourceSettings": _settings.SourceSettings,
    "DatasetSettings": _settings.DatasetSettings,
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_native_loader_reads_the_fields_the_dataclass_defines(name: str) -> None:
    fields = [field.name for field in dataclasses.fields(SETTINGS[name])]
    assert fields == _native.SETTINGS_FIELDS[name]


def test_every_settings_dataclass_is_one_the_native_loader_reads() -> None:
    assert sorted(_native.SETTINGS_FIELDS) == sorted(SETTINGS)
    assert sorted(_settings.__all__) == sorted([*SETTINGS, "checked_settings"])


def _stub_parameters(method: str) -> list[tuple[str, str]]:
    """The parameters of ``NativeLoader.<method>`` in the stub, with their annotations."""
    stub = Path(_native.__file__).with_name("_native.pyi")
    tree = ast.parse(stub.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "NativeLoader":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return [
                        (arg.arg, ast.unparse(arg.annotation) if arg.annotation else "")
                        for arg in item.args.args
                        if arg.arg != "self"
                    ]
    raise AssertionError(f"the stub has no NativeLoader.{method}")


def test_the_stub_takes_the_settings_whole() -> None:
    assert _stub_parameters("__init__") == [
        ("settings", "LoaderSettings"),
        ("source", "SourceSettings"),
    ]
    assert _stub_parameters("from_dataset") == [
        ("settings", "LoaderSettings"),
        ("dataset", "DatasetSettings"),
    ]


def test_a_missing_setting_is_refused_by_name() -> None:
    """The native side reads every field: an object without one cannot pass for the settings."""

    class Partial:
        batch_size = 4

    with pytest.raises(Exception, match="shuffle"):
        _native.NativeLoader.from_dataset(Partial(), Partial())  # type: ignore[arg-type]


def _documented(doc: str) -> list[str]:
    """The names the ``Args:`` section of ``doc`` documents, in order."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index("Args:") + 1
    names = []
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break
        match = re.match(r"^    (\w+):", line)
        if match:
            names.append(match.group(1))
    return names


def _parameters(function: object) -> list[str]:
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
        if name not in ("self", "cls") and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]


def test_every_argument_of_loader_is_documented_in_its_order() -> None:
    assert stoker.Loader.__doc__ is not None
    assert _documented(stoker.Loader.__doc__) == _parameters(stoker.Loader.__init__)


def test_every_argument_of_from_dataset_is_documented_there_or_in_loaders_args() -> None:
    doc = stoker.Loader.from_dataset.__doc__
    assert doc is not None and stoker.Loader.__doc__ is not None
    loaders = set(_documented(stoker.Loader.__doc__))
    missing = [
        name
        for name in _parameters(stoker.Loader.from_dataset)
        if f"``{name}``" not in doc and name not in loaders
    ]
    assert missing == []
