"""pyproject.toml maps core/, backends/, plugins/ and configs/ under the one import name `tileinfer`,
and declares every package they import: the command line runs with the dependencies alone, the
server and the Triton kernels each name the extra that brings theirs."""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert found == listed, f"unlisted: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"
    assert all(name == "tileinfer" or name.startswith("tileinfer.") for name in listed)


def test_default_config_ships_inside_the_package():
    from tileinfer.config import default_config_path

    assert default_config_path().is_file()


def test_test_modules_outside_packages_have_unique_names():
    """pytest imports a test file outside a package (a folder without __init__.py) by its bare
    name, with pyproject's ``pythonpath`` folders on sys.path: two such files of one name collide
    at collection ("import file mismatch"), which a run of one folder does not show."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if (path.parent / "__init__.py").is_file():
            continue
        assert path.stem not in seen, f"{path.relative_to(ROOT)} and {seen[path.stem].relative_to(ROOT)}"
        seen[path.stem] = path


# -- dependencies: every import declared, the command line without the extras -----------------------

SOURCES = ("core", "backends", "plugins")  # the folders of the package `tileinfer`
RUNTIME_EXTRAS = ("serve", "triton", "structured")  # what the package's own modules may import beyond the dependencies


def _distribution_name(requirement: str) -> str:
    """PEP 503's normalized name of a requirement string (``"Jinja2>=3.1"`` -> ``"jinja2"``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())[0]).lower()


def _declared() -> dict[str, set[str]]:
    """Distribution names by group: ``"runtime"`` (the dependencies) and each extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"runtime": project["dependencies"], **project["optional-dependencies"]}
    return {group: {_distribution_name(r) for r in requirements} for group, requirements in groups.items()}


@functools.lru_cache(maxsize=1)
def _distributions_of_modules() -> dict[str, list[str]]:
    """importlib.metadata.packages_distributions() (it reads every installed distribution's files)."""
    return importlib.metadata.packages_distributions()


def _statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every statement of ``tree``, nested ones (in functions, classes, ifs, trys) included."""
    stack: list = [tree]
    while stack:
        node = stack.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend(getattr(node, field, None) or [])


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level module names imported anywhere (module level or in a function) by the package's
    own files, outside the standard library, each with the files importing it."""
    found: dict[str, set[str]] = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in _statements(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "tileinfer":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_declared():
    """Each package that core/, backends/ or plugins/ imports is a dependency in pyproject.toml or
    in the serve or triton extra (not only in test or bench, which a user does not install)."""
    declared = _declared()
    allowed = set().union(declared["runtime"], *(declared[extra] for extra in RUNTIME_EXTRAS))
    distributions = _distributions_of_modules()
    imports = _third_party_imports()
    assert {"torch", "numpy", "safetensors"} <= set(imports)  # the scan sees the imports
    for module, files in sorted(imports.items()):
        names = {_distribution_name(d) for d in distributions.get(module, [])}
        assert names, f"{module} (imported by {sorted(files)}) is not installed here"
        assert names & allowed, (f"{module} (distribution {', '.join(sorted(names))}), imported by {sorted(files)}, "
                                 f"is not declared in pyproject.toml's dependencies or its {RUNTIME_EXTRAS} extras")


def test_the_extras_are_declared_for_the_readme_and_make_install():
    declared = _declared()
    assert not declared["runtime"] & {"triton", "fastapi", "uvicorn", "pytest", "transformers"}
    assert declared["triton"] == {"triton"} and {"fastapi", "uvicorn"} <= declared["serve"]
    assert "tileinfer" in declared["test"]  # as tileinfer[serve,triton]
    assert "'.[test]'" in (ROOT / "Makefile").read_text()


class _Hidden(importlib.abc.MetaPathFinder):
    """Fails the import of the top-level packages ``names``, as where they are not installed."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@contextmanager
def _tileinfer_without(distributions: set[str]) -> Iterator[None]:
    """A fresh import of ``tileinfer`` in this process, as in an environment that lacks
    ``distributions`` (their modules are hidden and their imports fail); the modules as they were
    afterwards."""
    by_module = _distributions_of_modules()
    hidden = {module for module, dists in by_module.items()
              if {_distribution_name(d) for d in dists} & distributions}
    swapped = hidden | {"tileinfer"}
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] in swapped}
    for name in saved:
        del sys.modules[name]
    finder = _Hidden(hidden)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if name.split(".")[0] in swapped]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_the_command_line_needs_only_the_dependencies(tiny_checkpoint, capsys):
    """With nothing of the extras installed (the serve and triton extras, the test stack),
    ``tileinfer generate`` runs the default config on a CPU; ``serve`` and the Triton kernels are
    one ``error:`` line naming the extra to install."""
    declared = _declared()
    absent = set().union(*(names for group, names in declared.items() if group != "runtime"))
    absent -= declared["runtime"] | {"pytest", "setuptools", "tileinfer"}  # the running test's own
    assert {"triton", "fastapi", "transformers"} <= absent
    with _tileinfer_without(absent):
        from tileinfer.cli import main

        code = main(["-q", "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "1,2,3", "--max-new-tokens",
                     "2", "device=cpu", "dtype=float32"])
        out, err = capsys.readouterr()
        assert code == 0 and out and "error" not in err, err
        assert "triton" not in sys.modules and "fastapi" not in sys.modules
        code = main(["-q", "serve", "--model", str(tiny_checkpoint)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "pip install 'tileinfer[serve]'" in err, err
        code = main(["-q", "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "1,2,3", "device=cpu",
                     "linear=triton"])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and "pip install 'tileinfer[triton]'" in err, err
