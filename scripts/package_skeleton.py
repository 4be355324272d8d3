"""Make the folders of every package pyproject.toml names, each with an empty ``__init__.py``.

The Dockerfile installs the project's dependencies from pyproject.toml alone (this skeleton in
place of the source), so that a change to the source rebuilds only the image's last, small layer.

    python scripts/package_skeleton.py DIR    # DIR holds pyproject.toml
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools looks for ``package``: under the longest ``package-dir`` entry that owns it."""
    owner = max((k for k in package_dir if package == k or package.startswith(k + ".")), key=len)
    return Path(package_dir[owner], *package[len(owner) :].split(".")[1:])


def make(root: Path) -> list[Path]:
    with open(root / "pyproject.toml", "rb") as file:
        setup = tomllib.load(file)["tool"]["setuptools"]
    made = []
    for package in setup["packages"]:
        path = root / folder(package, setup["package-dir"])
        path.mkdir(parents=True, exist_ok=True)
        (path / "__init__.py").touch()
        made.append(path)
    return made


if __name__ == "__main__":
    make(Path(sys.argv[1]))
