"""tests/archives: handlers in-process on the archives `make build` writes to model_store/ (real
weights: ImageNet classes, MiniLM's sentence similarity, the trained digits, co2 and tinylm models).
Slow to build from scratch, quick once built; what tests/unit's tiny models cannot know lives here."""

from __future__ import annotations

import pytest

from build.archive import build_entry
from build.catalogue import Catalogue
from serving.fake_context import extract
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT
from tests.inprocess import encode, make_handler, png_of  # noqa: F401 - the tests import them from here


@pytest.fixture(scope="session")
def archive_dirs(tmp_path_factory):
    """model name -> folder holding the extracted real archive (built here if stale: incremental)."""
    catalogue = Catalogue.load(CATALOGUE)
    dirs = {}
    for name in catalogue.names:
        result = build_entry(catalogue, name, REPO_ROOT, MODEL_STORE, progress=lambda _: None)
        dirs[name] = extract(result.archive, tmp_path_factory.mktemp(name))
    return dirs


@pytest.fixture(scope="session")
def eager_archive_dirs(tmp_path_factory):
    """model name -> extracted archive of the same entry exported as an eager state dict
    (the fp32 reference runs from these: a TorchScript archive has its precision baked in)."""
    from benchmarks.bench.inprocess import extracted_archive

    into = tmp_path_factory.mktemp("eager")
    return {name: extracted_archive(name, "eager", into) for name in ("efficientnet_lite0", "minilm")}
