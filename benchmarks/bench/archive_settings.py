"""A copy of an archive with some of its handler settings changed (the archive itself untouched):
how a benchmark serves one model under settings the catalogue does not ship."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Mapping

import yaml


def with_handler_settings(src: Path, store: Path, name: str, sections: Mapping[str, Mapping]) -> None:
    """`store/<name>.mar`: `src` with each `sections` entry merged into the handler section of its
    model-config.yaml (`{"causal_lm": {"speculation": "off"}}`, say)."""
    store.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(store / f"{name}.mar", "w", zipfile.ZIP_STORED) as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename == "model-config.yaml":
                config = yaml.safe_load(data)
                for section, values in sections.items():
                    config["handler"].setdefault(section, {}).update(values)
                data = yaml.safe_dump(config, sort_keys=False).encode()
            new.writestr(item, data)
