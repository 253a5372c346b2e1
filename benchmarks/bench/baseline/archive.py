"""Package the stock baseline of a catalogue model with torch-model-archiver's Python API.

Same weights and labels/tokenizer files as the catalogue entry, but the raw files (state dict,
safetensors), the naive handlers of this folder and no model-config.yaml: TorchServe's defaults.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from benchmarks.serving.errors import BenchmarkError
from benchmarks.serving.repo import REPO_ROOT

HERE = Path(__file__).resolve().parent
# The catalogue's handler -> the naive handler (and model file) standing in for it.
NAIVE = {
    "handlers/image_classifier.py": ("image_handler.py", "image_model.py"),
    "handlers/text_embedder.py": ("text_handler.py", None),
}
# Files AutoTokenizer/AutoModel read, found next to the text model's weights.
TEXT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@dataclass(frozen=True)
class BaselineSpec:
    name: str
    handler: Path
    model_file: Optional[Path]
    serialized: Path
    extra_files: Tuple[Tuple[Path, str], ...]  # (source, name inside the archive)


def baseline_spec(model: str, root: Path = REPO_ROOT) -> BaselineSpec:
    from build.catalogue import Catalogue

    entry = Catalogue.load(root / "catalogue.yaml").entry(model)
    if entry.handler not in NAIVE:
        raise BenchmarkError(f"no stock baseline for {model!r} (handler {entry.handler})")
    handler, model_file = NAIVE[entry.handler]
    weights = entry.weights.source.resolve(root, f"model {model!r} weights")
    extras = {e.name: e.source.resolve(root, f"model {model!r} extra file {e.name!r}") for e in entry.extra_files}
    if model_file is not None:
        labels = extras.get(entry.settings.get("model", {}).get("labels", "labels.json"))
        files = ((labels, "index_to_name.json"),) if labels else ()
    else:
        files = tuple((weights.parent / n, n) for n in TEXT_FILES if (weights.parent / n).is_file())
    return BaselineSpec(model, HERE / handler, HERE / model_file if model_file else None, weights, files)


def build_baseline(model: str, store: Path, root: Path = REPO_ROOT) -> Path:
    """Write <store>/<model>.mar (the stock baseline) and return its path."""
    from model_archiver.model_archiver_config import ModelArchiverConfig

    from build.archive import generate_archive, stage_files

    spec = baseline_spec(model, root)
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"baseline-{model}-", dir=store) as tmp:
        stage = Path(tmp)
        # The handlers package rides along for its shared helpers (mean pooling), not its optimisations.
        content = stage_files(root, stage, {name: source for source, name in spec.extra_files})
        config = ModelArchiverConfig(
            model_name=model,
            handler=str(spec.handler),
            model_file=str(spec.model_file) if spec.model_file else None,
            version="1.0",
            serialized_file=str(spec.serialized),
            extra_files=str(content),
            export_path=str(store),
            force=True,
        )
        generate_archive(config, stage)
    archive = store / f"{model}.mar"
    if not archive.is_file():
        raise BenchmarkError(f"torch-model-archiver wrote no {archive}")
    return archive
