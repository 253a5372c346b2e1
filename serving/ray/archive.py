"""One model archive (.mar) unpacked for a Ray Serve replica: its folder, manifest and model-config.yaml
(the facts TorchServe's worker reads of an archive at start-up)."""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from serving.errors import StartupError

DEFAULT_VERSION = "1.0"


@dataclass(frozen=True)
class Archive:
    """One unpacked .mar: its folder, manifest and model-config.yaml."""

    model_dir: Path
    manifest: Mapping[str, Any]
    model_config: Mapping[str, Any]

    @classmethod
    def unpack(cls, mar: Path, into: Path) -> Archive:
        try:
            with zipfile.ZipFile(mar) as archive:
                archive.extractall(into)
            manifest = json.loads((into / "MAR-INF" / "MANIFEST.json").read_text(encoding="utf-8"))
            config_file = into / "model-config.yaml"
            config = yaml.safe_load(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        except (OSError, zipfile.BadZipFile, ValueError, yaml.YAMLError) as exc:
            raise StartupError(f"{mar}: not a readable model archive ({exc}); rebuild it: .venv/bin/python -m build") from exc
        return cls(into, manifest, config or {})

    @property
    def version(self) -> str:
        return str((self.manifest.get("model") or {}).get("modelVersion", DEFAULT_VERSION))

    def import_package(self, *modules: str) -> tuple[ModuleType, ...]:
        """These modules of the handler package shipped in this archive (its folder first on sys.path, as
        TorchServe's worker does, so the archive's copy runs and not the repository's); an archive built
        before one of them existed is refused with the fix."""
        sys.path.insert(0, str(self.model_dir))
        try:
            return tuple(importlib.import_module(name) for name in modules)
        except ImportError as exc:
            raise StartupError(f"{self.model_dir.name}: its handler package lacks what Ray needs ({exc}); rebuild the "
                               "archive: .venv/bin/python -m build") from exc
