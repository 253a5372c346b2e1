"""Unit-test fixtures: tiny models of every family (tests/tiny.py), built into archives by the real
build once per session in a temp folder, extracted, and run by the handler in-process. Nothing here
reads model_store/: the archives `make build` makes are tests/archives' business."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from build.archive import build_entry
from build.catalogue import Catalogue
from serving.fake_context import extract
from tests.inprocess import encode, make_handler, png_of  # noqa: F401 - the tests import them from here
from tests.tiny import tiny_project

# Property tests (hypothesis, derandomized: a failure reproduces on every run): `make test` and CI run
# a third of each test's examples, `make test-all` (HYPOTHESIS_PROFILE=thorough) every one.
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"


def fuzz_examples(thorough: int) -> int:
    """A property test's example count: `thorough` under make test-all, a third of it otherwise."""
    return thorough if THOROUGH else max(10, thorough // 3)


# The build times every variant for its report (1.5 s per batch size by default): meaningless for
# tiny models, and most of the build's time.
SPEED_SECONDS = 0.01


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Tiny models gain nothing from a second intra-op thread: it only adds hand-offs, and where
    other jobs share the cores, spin-waits that turn milliseconds into seconds. Set before every
    test, after any handler a fixture made has applied its own thread budget."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_catalogue(tmp_path_factory) -> Path:
    """The tiny models' catalogue.yaml; its folder holds their files (paths are relative to it)."""
    return tiny_project(tmp_path_factory.mktemp("tiny") / "project")


@pytest.fixture(scope="session")
def tiny_dirs(tiny_catalogue, tmp_path_factory) -> dict[str, Path]:
    """Tiny model name -> folder holding its extracted archive (built once per session)."""
    catalogue = Catalogue.load(tiny_catalogue)
    store = tiny_catalogue.parent.parent / "store"
    dirs = {}
    for name in catalogue.names:
        result = build_entry(catalogue, name, tiny_catalogue.parent, store, progress=lambda _: None,
                             speed_seconds=SPEED_SECONDS)
        dirs[name] = extract(result.archive, tmp_path_factory.mktemp(name))
    return dirs
