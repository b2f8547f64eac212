"""pyproject.toml maps core/, backends/, plugins/ and configs/ under the one import name `tileinfer`."""

from __future__ import annotations

import tomllib
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
