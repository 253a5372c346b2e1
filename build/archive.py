"""Stage an entry's files and package them with torch-model-archiver's Python API.

Every archive runs the same handler (handlers/handler.py, the request loop) with the handlers
package beside it; the entry's family, settings and source go into its model-config.yaml.

Incremental: a content hash of every input (catalogue entry, handler package, the model's source
files and weights, extra files, tool versions) is recorded per archive; an unchanged archive is not
rebuilt. A new archive is written next to the store and moved in only when complete, so a failed
build leaves the old one intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import torch
import yaml

import handlers
from build import export
from build.catalogue import Catalogue, ModelEntry

STATE_FILE = ".build-state.json"
HANDLER = "handlers/handler.py"  # the handler TorchServe runs, the same for every archive
HANDLERS = Path(handlers.__file__).resolve().parent  # the package every archive carries


@dataclass(frozen=True)
class BuildResult:
    name: str
    archive: Path
    rebuilt: bool
    seconds: float = 0.0


def handler_package_files() -> Iterable[Path]:
    return sorted(p for p in HANDLERS.rglob("*.py") if "__pycache__" not in p.parts)


def input_hash(entry_raw, root: Path, sources: Iterable[Path], extras: Iterable[Path]) -> str:
    from model_archiver.version import __version__ as archiver_version

    digest = hashlib.sha256()
    digest.update(json.dumps(entry_raw, sort_keys=True, default=str).encode())
    digest.update(f"torch={torch.__version__} archiver={archiver_version}".encode())
    for path in [*handler_package_files(), *sources, *extras]:
        digest.update(str(path.name).encode())
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _read_state(store: Path) -> dict:
    try:
        return json.loads((store / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(store: Path, name: str, digest: str) -> None:
    state = _read_state(store)
    state[name] = digest
    tmp = store / f"{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, store / STATE_FILE)


def stage_files(stage: Path, extras: dict) -> Path:
    """Lay out what goes inside the archive; returns the folder passed as extra_files.

    torch-model-archiver copies an extra-files folder's *contents* to the archive root, keeping
    sub-folders: so `handlers/` goes in one level down and arrives with its structure intact.
    """
    content = stage / "content"
    shutil.copytree(HANDLERS, content / "handlers", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, source in extras.items():
        shutil.copy2(source, content / name)
    return content


def generate_archive(config, stage: Path) -> None:
    """ModelArchiver.generate_model_archive with its scratch folder inside `stage`.

    The archiver stages into tempfile.gettempdir()/<model name> and deletes that folder first:
    pointing it at our private stage keeps parallel builds and unrelated /tmp folders safe.
    """
    from model_archiver.model_archiver import ModelArchiver

    saved, tempfile.tempdir = tempfile.tempdir, str(stage)
    try:
        ModelArchiver.generate_model_archive(config)
    finally:
        tempfile.tempdir = saved


def package(entry: ModelEntry, stage: Path, content: Path, weights: Path, out: Path) -> Path:
    from model_archiver.model_archiver_config import ModelArchiverConfig

    config = ModelArchiverConfig(
        model_name=entry.name,
        handler=str(content / HANDLER),
        version=entry.version,
        serialized_file=str(weights),
        extra_files=str(content),
        export_path=str(out),
        config_file=str(stage / "model-config.yaml"),
        force=True,
    )
    generate_archive(config, stage)
    return out / f"{entry.name}.mar"


def build_entry(catalogue: Catalogue, name: str, root: Path, store: Path, force: bool = False,
                progress=print) -> BuildResult:
    started = time.perf_counter()
    entry = catalogue.entry(name)
    section = export.handler_section(entry)
    settings = export.parse_settings(entry, section)
    extras = {e.name: e.source.resolve(root, f"model {name!r} extra file {e.name!r}") for e in entry.extra_files}
    digest = input_hash(catalogue.raw_entries[name], root, entry.model.input_files(root), extras.values())
    archive = store / f"{name}.mar"
    if not force and archive.is_file() and _read_state(store).get(name) == digest:
        return BuildResult(name, archive, rebuilt=False)

    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-", dir=store) as tmp:
        stage = Path(tmp)
        content = stage_files(stage, extras)
        stage_source = getattr(entry.model, "stage", None)
        if stage_source is not None:
            stage_source(root, content)
        family = export.make_family(entry, settings, content)
        progress(f"  {name}: exporting the {entry.family} model ({entry.serialisation})")
        served = export.export(entry, settings, family, root, content)
        progress(f"  {name}: trying it on its family's batch and {len(entry.examples)} example(s)")
        for problem in export.smoke_test(entry, family, served, settings, root):
            progress(f"  {name}: warning: {problem}")
        served = Path(shutil.move(str(served), stage / served.name))
        (stage / "model-config.yaml").write_text(yaml.safe_dump({"handler": section}, sort_keys=False))
        progress(f"  {name}: archiving")
        out = stage / "out"
        out.mkdir()
        built = package(entry, stage, content, served, out)
        os.replace(built, archive)
    _write_state(store, name, digest)
    return BuildResult(name, archive, rebuilt=True, seconds=time.perf_counter() - started)


def archived_frontend_keys(archive: Path) -> Optional[list]:
    """Frontend keys found in an archive's model-config.yaml (they would override config.properties)."""
    import zipfile

    from build.catalogue import FRONTEND_KEYS

    with zipfile.ZipFile(archive) as mar:
        names = [n for n in mar.namelist() if n.endswith("model-config.yaml")]
        if not names:
            return []
        config = yaml.safe_load(mar.read(names[0])) or {}
    return [key for key in FRONTEND_KEYS if key in config]
