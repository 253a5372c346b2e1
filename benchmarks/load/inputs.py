"""What every tool sends a model: the example requests of its catalogue entry (build/examples.py),
as HTTP bodies for the load generator and as a worker receives them for in-process runs. Also the
real photos (scikit-image's wheel) the bad-input corpus takes apart."""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from benchmarks.load.errors import BenchmarkError
from build.catalogue import Catalogue
from build.examples import Request, worker_input
from build.export import served_settings
from handlers.families import family_class
from serving.repo import CATALOGUE

# Colour photographs of real scenes.
PHOTO_FILES = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png", "retina.jpg")


@cache
def requests(model: str, catalogue: Path = CATALOGUE) -> tuple[Request, ...]:
    """The entry's examples as HTTP requests (body bytes and Content-Type); for an entry that lists
    none, its family's example inputs (Family.example_inputs)."""
    entry = Catalogue.load(catalogue).entry(model)
    if entry.examples:
        # Paths in a catalogue are relative to its folder (the repository's, for catalogue.yaml).
        return tuple(example.request(Path(catalogue).resolve().parent) for example in entry.examples)
    found = family_class(entry.family).example_inputs(served_settings(entry).family_settings)
    if not found:
        raise BenchmarkError(f"model {model!r} has no examples and its family {entry.family!r} gives none: add "
                             "`examples:` to its catalogue entry (requests the tools send it)")
    return tuple(Request(case.body, case.content_type or "") for case in found)


def worker_requests(model: str, catalogue: Path = CATALOGUE) -> tuple[tuple[Any, str], ...]:
    """The examples as a TorchServe worker receives them: (decoded body, content type)."""
    return tuple((worker_input(r.body, r.content_type), r.content_type) for r in requests(model, catalogue))


def data_dir() -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data"


@lru_cache(maxsize=1)
def photo_bytes() -> dict[str, bytes]:
    """The photos' original files, by name."""
    return {name: (data_dir() / name).read_bytes() for name in PHOTO_FILES}
