"""Where a catalogue's files come from: an installed package or the repository; the check every
catalogue mapping goes through (unknown keys named); and the one every path an entry names goes
through: written relative and without '..' (checked when the entry is read), and still inside the
repository, or its package, once every symbolic link is followed (checked when it is opened)."""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Optional

from build.errors import CatalogueError


def only_keys(where: str, mapping: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    if not isinstance(mapping, Mapping):
        raise CatalogueError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise CatalogueError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    missing = [key for key in required if key not in mapping]
    if missing:
        raise CatalogueError(f"{where}: missing key {missing[0]!r}")


INSIDE_FIX = ("give a path relative to the repository root (with package:, to the package's folder) that stays "
              "inside it; copy a file from elsewhere into the repository first, e.g. into models/<name>/")


def relative_path(where: str, value: Any) -> str:
    """`value` as a path the catalogue may name: a relative path that never climbs out through '..'."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise CatalogueError(f"{where}: expected a path relative to the repository, got {value!r}")
    if PurePosixPath(value).is_absolute() or PureWindowsPath(value).anchor or ".." in PurePosixPath(value).parts:
        raise CatalogueError(f"{where}: {value!r} is not inside its folder: {INSIDE_FIX}")
    return value


def inside(base: Path, relative: str, where: str, what: str = "the repository") -> Path:
    """`base / relative` with every symbolic link followed; an error unless it is still inside `base`."""
    base = base.resolve()
    found = (base / relative).resolve()
    if not found.is_relative_to(base):
        raise CatalogueError(f"{where}: {relative!r} leads to {found}, outside {what} {base} "
                             f"(a symbolic link?): {INSIDE_FIX}")
    return found


@dataclass(frozen=True)
class FileSource:
    """A file (or folder) of an installed Python package (package + file) or of the repository (path)."""

    package: Optional[str]
    file: Optional[str]
    path: Optional[str]

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any], extra: tuple[str, ...] = ()) -> FileSource:
        only_keys(where, raw, ("package", "file", "path") + extra)
        if ("path" in raw) == ("package" in raw or "file" in raw):
            raise CatalogueError(f"{where}: give either 'path' (in the repository) or 'package' + 'file'")
        if "package" in raw and "file" not in raw:
            raise CatalogueError(f"{where}: 'package' needs 'file'")
        key = "path" if "path" in raw else "file"
        name = relative_path(f"{where}.{key}", raw[key])
        return cls(package=raw.get("package"), file=name if key == "file" else None, path=name if key == "path" else None)

    @property
    def name(self) -> str:
        return Path(self.path or self.file).name

    def resolve(self, root: Path, where: str, folder: bool = False) -> Path:
        if self.path is not None:
            found = inside(root, self.path, where)
        else:
            try:
                package = Path(str(importlib.resources.files(self.package)))
            except ModuleNotFoundError:
                raise CatalogueError(f"{where}: package {self.package!r} is not installed") from None
            found = inside(package, self.file, where, f"package {self.package!r}")
        if not (found.is_dir() if folder else found.is_file()):
            raise CatalogueError(f"{where}: {'folder' if folder else 'file'} not found: {found}")
        return found
