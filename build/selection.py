"""Which archives to build for a TorchServe config: what its `load_models` names, as catalogue
entries and their variants.

    load_models=efficientnet_lite0=efficientnet_lite0.mar,minilm=minilm.onnx.mar
        -> efficientnet_lite0: (torchscript,)   minilm: (onnx,)

An archive's file name says which entry and variant build it (build/variants.py: `<model>.mar` is
the entry's default variant, `<model>.<variant>.mar` another; a model name holds no dot). `all`
asks for every entry and every variant, as TorchServe then loads whatever the store holds.
An archive no catalogue entry builds (one put in the store by hand, say) is left to the caller:
it may already be in the store. The example requests of what is served must be at hand too:
`make serve` prints a curl line sending each model's first one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from build.catalogue import Catalogue
from build.errors import CatalogueError
from handlers import properties

LOAD_MODELS = "load_models"
ARCHIVE_SUFFIX = ".mar"


def load_models_items(value: str) -> Optional[tuple[tuple[str, str], ...]]:
    """TorchServe's load_models as (model name, archive) pairs, the name "" where an item gives
    the archive alone; None for `all`."""
    value = value.strip()
    if value.lower() == "all":
        return None
    items = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, archive = item.rpartition("=")
        items.append((name.strip(), archive.strip()))
    return tuple(items)


@dataclass(frozen=True)
class Selection:
    """Entry name -> the variants to build (in the entry's order); archives no entry builds."""

    variants: Mapping[str, tuple[str, ...]]
    foreign: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.variants)


def resolve(catalogue: Catalogue, load_models: str, where: str = LOAD_MODELS) -> Selection:
    """The entries and variants whose archives `load_models` names; `where` names the setting in
    messages. A broken entry named by it fails here, before anything is built."""
    items = load_models_items(load_models)
    if items is None:
        return Selection({name: tuple(v.name for v in catalogue.entry(name).variants) for name in catalogue.names})
    if not items:
        raise CatalogueError(f"{where} is empty: name the archives to serve, e.g. "
                             f"{LOAD_MODELS}={catalogue.names[0]}={catalogue.names[0]}{ARCHIVE_SUFFIX}")
    wanted: dict = {}
    foreign = []
    for _, archive in items:
        file = Path(archive).name
        if not file.endswith(ARCHIVE_SUFFIX):
            raise CatalogueError(f"{where}: {archive!r} is not a .mar file name: give name=<file>{ARCHIVE_SUFFIX}")
        model = file[: -len(ARCHIVE_SUFFIX)].split(".", 1)[0]
        if file != archive or model not in catalogue.names:
            foreign.append(archive)
            continue
        entry = catalogue.entry(model)
        by_archive = {v.archive_name(model): v.name for v in entry.variants}
        if file not in by_archive:
            raise CatalogueError(f"{where}: {file} is no archive of catalogue entry {model!r} (its archives: "
                                 f"{', '.join(by_archive)}): name one of them, or add the variant to its variants")
        wanted.setdefault(model, set()).add(by_archive[file])
    ordered = {model: tuple(v.name for v in catalogue.entry(model).variants if v.name in chosen)
               for model, chosen in wanted.items()}
    return Selection(ordered, tuple(foreign))


def for_config(catalogue: Catalogue, config: Path) -> Selection:
    """What a config.properties file loads at start (its `load_models`)."""
    config = Path(config)
    if not config.is_file():
        raise CatalogueError(f"config file not found: {config}")
    props = properties.read(config)
    if LOAD_MODELS not in props:
        raise CatalogueError(f"{config.name} has no {LOAD_MODELS}= line: add one naming the archives to serve, "
                             f"e.g. {LOAD_MODELS}={catalogue.names[0]}={catalogue.names[0]}{ARCHIVE_SUFFIX}")
    return resolve(catalogue, props[LOAD_MODELS], f"{config.name} {LOAD_MODELS}")


def check_examples(catalogue: Catalogue, selection: Selection, root: Path) -> None:
    """Every example request file of the selected entries is there (an archive that is up to date
    is not rebuilt, so its build would not notice one gone)."""
    for name in selection.names:
        for i, example in enumerate(catalogue.entry(name).examples):
            if example.file is not None:
                example.file.resolve(root, f"model {name!r} examples[{i}]")
