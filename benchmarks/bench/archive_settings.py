"""A copy of an archive with some of its handler settings changed (the archive itself untouched):
how a benchmark or a test serves one model under settings the catalogue does not ship.

What the settings decide beyond the handler section follows them, as the build writes it: the
family's frontend keys of model-config.yaml (a causal LM's asyncCommunication or continuousBatching)
and the handler file TorchServe runs (MANIFEST.json's, at the archive's root).
"""

from __future__ import annotations

import copy
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import yaml

from handlers.families import family_class
from handlers.settings import HandlerSettings

MANIFEST = "MAR-INF/MANIFEST.json"


def with_handler_settings(src: Path, store: Path, name: str, sections: Mapping[str, Mapping]) -> None:
    """`store/<name>.mar`: `src` with each `sections` entry merged into the handler section of its
    model-config.yaml (`{"causal_lm": {"speculation": "off"}}`, say)."""
    store.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as old:
        config = yaml.safe_load(old.read("model-config.yaml"))
        before = HandlerSettings.from_mapping(config["handler"])
        for section, values in sections.items():
            config["handler"].setdefault(section, {}).update(values)
        after = HandlerSettings.from_mapping(config["handler"])
        family = family_class(after.family)
        for key in family.archive_keys(before.family_settings):
            config.pop(key, None)
        config = {**family.archive_keys(after.family_settings), **config}
        entry = family.handler_entry(after.family_settings)
        manifest = json.loads(old.read(MANIFEST))
        manifest["model"]["handler"] = Path(entry).name
        replaced = {"model-config.yaml": yaml.safe_dump(config, sort_keys=False).encode(),
                    MANIFEST: json.dumps(manifest, indent=2).encode()}
        with zipfile.ZipFile(store / f"{name}.mar", "w", zipfile.ZIP_STORED) as new:
            for item in old.infolist():  # a copy of each entry's info: writestr rewrites the one it gets
                new.writestr(copy.copy(item), replaced.get(item.filename) or old.read(item))
            if Path(entry).name not in old.namelist():  # the root copy TorchServe imports the handler from
                new.writestr(Path(entry).name, old.read(entry))


def with_cache(src: Path, store: Path, name: str, max_mib: float) -> None:
    """`store/<name>.mar`: the archive with `response_cache.max_mib` set."""
    with_handler_settings(src, store, name, {"response_cache": {"max_mib": max_mib, "max_entries": 100_000}})
