"""The package's shape: no module imports another that imports it back (directly or through
others, at the top or inside a function), and no module takes another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

PACKAGE = Path(stoker.__file__).parent


def _imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports anywhere in its body
    (the native extension, ``stoker._native``, left out: it imports nothing back)."""
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "stoker":
                    found.update(alias.name for alias in node.names)
                elif node.module.startswith("stoker."):
                    found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("stoker."):
                        found.add(alias.name.split(".")[1])
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (the modules on it, the first repeated at the end)."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _imports()
    # The package's own __init__ imports everything it exports; nothing imports it back.
    graph.pop("__init__")
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph) or [])}"


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_no_module_takes_another_modules_private_names() -> None:
    taken = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("stoker.")
                and node.module != "stoker._native"
            ):
                taken += [
                    f"{path.name}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    assert taken == []


def test_the_mix_request_is_a_leaf() -> None:
    # stoker._loader reads a mix through it without importing stoker._mix, which builds
    # loaders. It checks each source's settings with the argument checks, themselves a leaf.
    # The loader's second constructor (stoker._dataset) is below the loader: it makes no
    # Loader itself, the class it is called on finishes it.
    graph = _imports()
    assert graph["_mix_request"] <= {"ops", "errors", "_arguments"}
    assert graph["_arguments"] <= {"errors"}
    assert "_mix" not in graph["_loader"]
    assert "_loader" not in graph["_dataset"]


# The modules a user imports by name; every other module of the package is private (its name
# starts with an underscore) and reached only through what `stoker` exports.
PUBLIC_MODULES = {"errors", "gpu", "ops", "vision"}


def test_the_public_surface_is_the_exports_and_four_modules() -> None:
    public = {
        path.stem
        for path in PACKAGE.glob("*.py")
        if not path.stem.startswith("_")
    }
    assert public == PUBLIC_MODULES
    # Each public module, and the package, lists what it exports, and each name is there.
    for module in [stoker, *(getattr(stoker, name, None) or _module(name) for name in public)]:
        exported = module.__all__
        assert exported, module.__name__
        missing = [name for name in exported if not hasattr(module, name)]
        assert missing == [], f"{module.__name__} exports names it lacks: {missing}"


def _module(name: str) -> object:
    import importlib

    return importlib.import_module(f"stoker.{name}")


def test_no_module_names_torch_in_an_import_statement() -> None:
    # torch is optional: `mypy --strict` (part of `./dev test`'s lint) fails on a static import
    # of a package that is not installed, which is how a machine without torch runs it. The
    # package imports torch by name (stoker._arguments.import_torch) instead.
    named = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            named += [
                f"{path.name}:{node.lineno}: {module}"
                for module in modules
                if module == "torch" or module.startswith("torch.")
            ]
    assert named == []
