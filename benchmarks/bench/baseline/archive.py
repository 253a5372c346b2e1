"""Package the stock baseline of a catalogue model with torch-model-archiver's Python API.

The stock way TorchServe's docs show, for the families that have one: an image classifier whose
source is a Python class gets BaseHandler's eager path (a model file whose class takes no
arguments, written here around the entry's class and args, and the state dict); a text embedder
from a Hugging Face folder gets AutoModel/AutoTokenizer on the folder's own files. No
model-config.yaml: TorchServe's defaults. Other models have no stock baseline (NoBaseline says why).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from benchmarks.load.errors import BenchmarkError
from build.catalogue import Catalogue, ModelEntry
from build.export import served_settings
from build.sources import HuggingFaceFolder, PythonSource
from handlers.families import family_class
from serving.repo import CATALOGUE, REPO_ROOT

HERE = Path(__file__).resolve().parent
# Files AutoTokenizer/AutoModel read from a Hugging Face folder.
TEXT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
MODEL_FILE = '''"""Model file of the stock baseline (torch-model-archiver --model-file), written by
benchmarks/bench/baseline/archive.py: BaseHandler instantiates the only class with no arguments."""

import torch

from {module} import {top}


class StockModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = {call}(**{args!r})

    def forward(self, x):
        return self.model(x)
'''


class NoBaseline(BenchmarkError):
    """The model's family or source has no stock TorchServe equivalent to compare with."""


@dataclass(frozen=True)
class Staged:
    handler: Path
    model_file: Optional[Path]
    serialized: Path


def _stage_image(entry: ModelEntry, root: Path, stage: Path, content: Path) -> Staged:
    source = entry.model
    top = source.attribute.split(".")[0]
    model_file = stage / "stock_model.py"
    model_file.write_text(MODEL_FILE.format(module=source.module_name, top=top, call=source.attribute,
                                            args=dict(source.args)))
    state = source.weights.state_dict(root, f"model {entry.name!r} weights")
    serialized = stage / "model.pt"
    torch.save({f"model.{key}": value for key, value in state.items()}, serialized)
    settings = served_settings(entry).family_settings
    (content / "baseline.json").write_text(json.dumps({
        "resize": settings.resize_size, "crop": settings.image_size, "mean": list(settings.mean),
        "std": list(settings.std), "grey": settings.channels == 1, "top_k": settings.top_k}))
    if settings.labels:
        extras = {e.name: e for e in entry.extra_files}
        labels = extras[settings.labels].source.resolve(root, f"model {entry.name!r} labels")
        (content / "index_to_name.json").write_bytes(labels.read_bytes())
    source.stage(root, content)
    return Staged(HERE / "image_handler.py", model_file, serialized)


def _stage_text(entry: ModelEntry, root: Path, content: Path) -> Staged:
    folder = entry.model.folder(root)
    for name in TEXT_FILES:
        if (folder / name).is_file():
            (content / name).write_bytes((folder / name).read_bytes())
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not weights:
        raise NoBaseline(f"{entry.name}: no weights file in {folder}")
    return Staged(HERE / "text_handler.py", None, weights[0])


# The stock handlers there are (a family names its own: Family.stock_baseline), each with the
# model source it can load.
STOCK_SOURCES: dict[str, type] = {"image": PythonSource, "text": HuggingFaceFolder}


def missing_baseline(entry: ModelEntry) -> Optional[str]:
    """Why the entry has no stock baseline, or None when it has one."""
    kind = family_class(entry.family).stock_baseline
    if kind is not None and isinstance(entry.model, STOCK_SOURCES[kind]):
        return None
    return (f"no stock baseline for a {entry.family} model from a {type(entry.model).__name__}: TorchServe's "
            "stock handlers cover image classifiers from a model class and text embedders from a Hugging Face folder")


def build_baseline(model: str, store: Path, root: Path = REPO_ROOT, catalogue: Path = CATALOGUE) -> Path:
    """Write <store>/<model>.mar (the stock baseline) and return its path; NoBaseline if none exists."""
    from model_archiver.model_archiver_config import ModelArchiverConfig

    from build.archive import generate_archive, stage_files

    entry = Catalogue.load(catalogue).entry(model)
    missing = missing_baseline(entry)
    if missing:
        raise NoBaseline(missing)
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"baseline-{model}-", dir=store) as tmp:
        stage = Path(tmp)
        # The handlers package rides along for its shared helpers (mean pooling), not its optimisations.
        content = stage_files(stage, {})
        kind = family_class(entry.family).stock_baseline
        staged = _stage_image(entry, root, stage, content) if kind == "image" else _stage_text(entry, root, content)
        config = ModelArchiverConfig(
            model_name=model,
            handler=str(staged.handler),
            model_file=str(staged.model_file) if staged.model_file else None,
            version="1.0",
            serialized_file=str(staged.serialized),
            extra_files=str(content),
            export_path=str(store),
            force=True,
        )
        generate_archive(config, stage)
    archive = store / f"{model}.mar"
    if not archive.is_file():
        raise BenchmarkError(f"torch-model-archiver wrote no {archive}")
    return archive
