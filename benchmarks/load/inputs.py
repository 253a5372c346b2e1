"""What every tool sends a model: the example requests of its catalogue entry (build/examples.py),
as HTTP bodies for the load generator and as a worker receives them for in-process runs. Also the
real photos (scikit-image's wheel) the bad-input corpus takes apart."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Tuple

from serving.errors import BenchmarkError
from serving.repo import CATALOGUE, REPO_ROOT
from build.catalogue import Catalogue
from build.examples import Example, Request, worker_input

# Colour photographs of real scenes.
PHOTO_FILES = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png", "retina.jpg")


@lru_cache(maxsize=None)
def examples(model: str, catalogue: Path = CATALOGUE) -> Tuple[Example, ...]:
    found = Catalogue.load(catalogue).entry(model).examples
    if not found:
        raise BenchmarkError(f"model {model!r} has no examples: add `examples:` to its catalogue entry "
                             "(requests the tools send it)")
    return found


@lru_cache(maxsize=None)
def requests(model: str, catalogue: Path = CATALOGUE) -> Tuple[Request, ...]:
    """The examples as HTTP requests: body bytes and Content-Type."""
    return tuple(example.request(REPO_ROOT) for example in examples(model, catalogue))


def worker_requests(model: str, catalogue: Path = CATALOGUE) -> Tuple[Tuple[Any, str], ...]:
    """The examples as a TorchServe worker receives them: (decoded body, content type)."""
    return tuple((worker_input(r.body, r.content_type), r.content_type) for r in requests(model, catalogue))


def data_dir() -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data"


@lru_cache(maxsize=1)
def photo_bytes() -> Dict[str, bytes]:
    """The photos' original files, by name."""
    return {name: (data_dir() / name).read_bytes() for name in PHOTO_FILES}
