"""Package the no-op handler as <store>/<model>.mar with torch-model-archiver's Python API.

The archive takes the real model's name so that the load generator sends it the model's own
requests (its catalogue examples) through the same URL: only the handler's work is gone.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.load.errors import BenchmarkError

HANDLER = Path(__file__).resolve().parent / "handler.py"


def build_noop(model: str, store: Path) -> Path:
    from model_archiver.model_archiver_config import ModelArchiverConfig

    from build.archive import generate_archive

    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"noop-{model}-", dir=store) as tmp:
        stage = Path(tmp)
        config = ModelArchiverConfig(model_name=model, handler=str(HANDLER), version="1.0",
                                     export_path=str(store), force=True)
        generate_archive(config, stage)
    archive = store / f"{model}.mar"
    if not archive.is_file():
        raise BenchmarkError(f"torch-model-archiver wrote no {archive}")
    return archive
