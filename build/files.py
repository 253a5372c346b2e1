"""Where a catalogue's files come from: an installed package or the repository; and the check
every catalogue mapping goes through (unknown keys named)."""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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
        return cls(package=raw.get("package"), file=raw.get("file"), path=raw.get("path"))

    @property
    def name(self) -> str:
        return Path(self.path or self.file).name

    def resolve(self, root: Path, where: str, folder: bool = False) -> Path:
        if self.path is not None:
            found = (root / self.path).resolve()
        else:
            try:
                found = Path(str(importlib.resources.files(self.package).joinpath(self.file)))
            except ModuleNotFoundError:
                raise CatalogueError(f"{where}: package {self.package!r} is not installed") from None
        if not (found.is_dir() if folder else found.is_file()):
            raise CatalogueError(f"{where}: {'folder' if folder else 'file'} not found: {found}")
        return found
