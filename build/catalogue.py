"""The catalogue: one YAML file saying what to serve and how, read into frozen dataclasses."""

from __future__ import annotations

import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml

from build.errors import CatalogueError

SERIALISATIONS = ("state_dict", "torchscript")
WEIGHT_FORMATS = ("torch", "safetensors")
# TorchServe's per-model frontend values, in the order config.properties' models= entries list
# them: GET /models/<name> reports them, and a model-config.yaml that set them would override
# config.properties (so the catalogue refuses them in a model's settings).
FRONTEND_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")


def _only_keys(where: str, mapping: Mapping[str, Any], allowed: Tuple[str, ...], required: Tuple[str, ...] = ()):
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
    """A file from an installed Python package (package + file) or from the repository (path)."""

    package: Optional[str]
    file: Optional[str]
    path: Optional[str]

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any], extra: Tuple[str, ...] = ()) -> "FileSource":
        _only_keys(where, raw, ("package", "file", "path") + extra)
        if ("path" in raw) == ("package" in raw or "file" in raw):
            raise CatalogueError(f"{where}: give either 'path' or 'package' + 'file'")
        if "package" in raw and "file" not in raw:
            raise CatalogueError(f"{where}: 'package' needs 'file'")
        return cls(package=raw.get("package"), file=raw.get("file"), path=raw.get("path"))

    def resolve(self, root: Path, where: str) -> Path:
        if self.path is not None:
            found = (root / self.path).resolve()
        else:
            try:
                found = Path(str(importlib.resources.files(self.package).joinpath(self.file)))
            except ModuleNotFoundError:
                raise CatalogueError(f"{where}: package {self.package!r} is not installed") from None
        if not found.is_file():
            raise CatalogueError(f"{where}: file not found: {found}")
        return found


@dataclass(frozen=True)
class Weights:
    source: FileSource
    format: str
    key_prefix: str  # prepended to every key, e.g. "bert." when the encoder is wrapped
    ignore_keys: Tuple[str, ...]  # key prefixes the architecture has no use for

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any]) -> "Weights":
        extra = ("format", "key_prefix", "ignore_keys")
        source = FileSource.parse(where, raw, extra)
        fmt = raw.get("format", "torch")
        if fmt not in WEIGHT_FORMATS:
            raise CatalogueError(f"{where}.format: {fmt!r} is not one of {list(WEIGHT_FORMATS)}")
        ignore = raw.get("ignore_keys", [])
        if not isinstance(ignore, list) or not all(isinstance(k, str) for k in ignore):
            raise CatalogueError(f"{where}.ignore_keys: expected a list of key prefixes")
        return cls(source, fmt, str(raw.get("key_prefix", "")), tuple(ignore))


@dataclass(frozen=True)
class ExtraFile:
    source: FileSource
    name: str  # its name inside the archive

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any]) -> "ExtraFile":
        source = FileSource.parse(where, raw, ("as",))
        default = Path(source.path or source.file).name
        name = str(raw.get("as", default))
        if "/" in name or name.startswith(".") or name == "handlers":
            raise CatalogueError(f"{where}.as: {name!r} must be a plain file name")
        return cls(source, name)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    version: str
    handler: str  # path of the handler module inside handlers/
    weights: Weights
    serialisation: str
    extra_files: Tuple[ExtraFile, ...]
    settings: Mapping[str, Any]  # the archive's handler section, minus 'weights' (the build sets it)
    slo_ms: float

    @property
    def handler_module(self) -> str:
        """'handlers/image_classifier.py' -> 'handlers.image_classifier'."""
        return self.handler[: -len(".py")].replace("/", ".")


_ENTRY_KEYS = ("version", "handler", "weights", "serialisation", "extra_files", "settings", "slo_ms")


def parse_entry(name: str, raw: Mapping[str, Any]) -> ModelEntry:
    where = f"model {name!r}"
    if not _NAME.match(name):
        raise CatalogueError(f"{where}: name must be letters, digits, '_' or '-', starting with a letter")
    _only_keys(where, raw, _ENTRY_KEYS, required=("version", "handler", "weights"))
    handler = str(raw["handler"])
    if not (handler.startswith("handlers/") and handler.endswith(".py")):
        raise CatalogueError(f"{where}.handler: expected a module under handlers/, e.g. handlers/my_model.py")
    serialisation = raw.get("serialisation", "state_dict")
    if serialisation not in SERIALISATIONS:
        raise CatalogueError(f"{where}.serialisation: {serialisation!r} is not one of {list(SERIALISATIONS)}")
    settings = raw.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise CatalogueError(f"{where}.settings: expected a mapping")
    frontend = [key for key in FRONTEND_KEYS if key in settings]
    if frontend or "weights" in settings:
        key = frontend[0] if frontend else "weights"
        raise CatalogueError(f"{where}.settings: {key!r} does not belong here (config.properties or the build sets it)")
    extras = raw.get("extra_files") or []
    if not isinstance(extras, list):
        raise CatalogueError(f"{where}.extra_files: expected a list")
    slo_ms = raw.get("slo_ms", 100)
    if not isinstance(slo_ms, (int, float)) or slo_ms <= 0:
        raise CatalogueError(f"{where}.slo_ms: expected a positive number of milliseconds")
    return ModelEntry(
        name=name,
        version=str(raw["version"]),
        handler=handler,
        weights=Weights.parse(f"{where}.weights", raw["weights"]),
        serialisation=serialisation,
        extra_files=tuple(ExtraFile.parse(f"{where}.extra_files[{i}]", e) for i, e in enumerate(extras)),
        settings=settings,
        slo_ms=float(slo_ms),
    )


@dataclass(frozen=True)
class Catalogue:
    path: Path
    raw_entries: Mapping[str, Any]

    @classmethod
    def load(cls, path: Path) -> "Catalogue":
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise CatalogueError(f"cannot read catalogue {path}: {err}") from None
        _only_keys(str(path), data or {}, ("models",), required=("models",))
        if not isinstance(data["models"], Mapping) or not data["models"]:
            raise CatalogueError(f"{path}: 'models' must map model names to entries")
        return cls(path=path, raw_entries=dict(data["models"]))

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(self.raw_entries)

    def entry(self, name: str) -> ModelEntry:
        """Parse one entry on demand, so one broken entry does not stop the others from building."""
        if name not in self.raw_entries:
            raise CatalogueError(f"no model {name!r} in {self.path} (known: {', '.join(self.names)})")
        return parse_entry(name, self.raw_entries[name])

    def entries(self) -> Dict[str, ModelEntry]:
        return {name: self.entry(name) for name in self.names}
