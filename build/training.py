"""Weights trained at build time: `weights: {train: models/digits/train.py}` in a catalogue entry,
or a whole Hugging Face folder: `huggingface: {train: models/tinylm/train.py}`.

The script (a repository file) defines `train(out: Path) -> dict`: it trains on data that installs
offline, writes `out/weights.safetensors` (or a Hugging Face folder: config.json, weights,
tokenizer.json) and returns its figures (held-out accuracy, perplexity, say). The
result is cached under `model_store/.trained/<script>-<hash>/`, keyed by the Python code of the
script's folder and the torch version: `make build` trains again only when those change (data files
beside the script, such as examples, held-out sets and the training report, are its outputs).

The figures are also written to `training_report.json` beside the script (committed: the model's
quality figures are read from there, never from the git-ignored cache).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from build.errors import CatalogueError

WEIGHTS = "weights.safetensors"


REPORT = "training_report.json"


def training_code(script: Path) -> list[Path]:
    """What decides a script's trained weights: the Python code of its folder. Data files beside it
    (examples, held-out sets, its training report) are what it writes, not what it reads."""
    return sorted(p for p in script.parent.rglob("*.py") if p.is_file() and "__pycache__" not in p.parts)


def _folder_hash(script: Path) -> str:
    digest = hashlib.sha256(f"torch={torch.__version__}".encode())
    for path in training_code(script):
        digest.update(str(path.relative_to(script.parent)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def trained_weights(script_path: str, root: Path, where: str, progress=print) -> Path:
    """The weights file the script trains, from the cache when its inputs are unchanged."""
    return trained_folder(script_path, root, where, WEIGHTS, progress) / WEIGHTS


def trained_folder(script_path: str, root: Path, where: str, expect: str, progress=print) -> Path:
    """The folder the script trains into (holding `expect`), from the cache when unchanged."""
    script = (root / script_path).resolve()
    if not script.is_file() or script.suffix != ".py":
        raise CatalogueError(f"{where}.train: {script_path!r} is not a .py file of the catalogue's folder")
    cache = root / "model_store" / ".trained" / f"{script.stem}-{_folder_hash(script)}"
    if (cache / expect).is_file():
        write_report(script, root, cache)
        return cache
    module_name = str(script.relative_to(root).with_suffix("")).replace("/", ".")
    # Trained on the first build of an archive that needs it, never before: each script prints its
    # steps with the time so far; this says what runs and how long it took.
    progress(f"  training with {script_path} (not cached yet; cached afterwards in {cache.relative_to(root)})")
    started = time.perf_counter()
    sys.path.insert(0, str(root))
    try:
        # Loaded from the file each time: a module imported earlier may be an older version of it.
        spec = importlib.util.spec_from_file_location(module_name, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        train = getattr(module, "train", None)
        if train is None:
            raise CatalogueError(f"{where}.train: {script_path} defines no train(out) function")
        scratch = cache.with_name(cache.name + ".tmp")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        figures = train(scratch)
    finally:
        sys.path.remove(str(root))
    if not (scratch / expect).is_file():
        raise CatalogueError(f"{where}.train: {script_path}'s train(out) wrote no {expect}")
    (scratch / "figures.json").write_text(json.dumps(figures or {}, indent=2) + "\n")
    scratch.rename(cache)
    progress(f"  trained in {time.perf_counter() - started:.0f} s: {json.dumps(figures or {})}")
    write_report(script, root, cache)
    return cache


def write_report(script: Path, root: Path, cache: Path) -> None:
    """<script folder>/training_report.json: the figures of the weights being archived (rewritten only
    when they change, so a cached build leaves the file alone)."""
    figures = json.loads((cache / "figures.json").read_text()) if (cache / "figures.json").is_file() else {}
    report = {"script": str(script.relative_to(root)), "torch": torch.__version__, "cache_key": cache.name,
              "figures": figures}
    path = script.parent / REPORT
    text = json.dumps(report, indent=2) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
