"""The modules of a package folder, for registries that find their built-in
entries by importing them: a new module in the folder registers itself, and
no list anywhere has to learn its name."""

from __future__ import annotations

import importlib
import pkgutil


def package_modules(package_name: str, exclude: tuple[str, ...] = ("registry",)) -> list[str]:
  """Dotted names of the package's own modules (not sub-packages), sorted."""
  package = importlib.import_module(package_name)
  return sorted(
    f"{package_name}.{info.name}"
    for info in pkgutil.iter_modules(package.__path__)
    if not info.ispkg and info.name not in exclude
  )
