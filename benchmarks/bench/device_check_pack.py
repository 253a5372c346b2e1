"""The device check's pack: what a device machine needs, under the device tool's 64 MiB.

Each catalogue model's archive as a GPU host serves it, extracted: its default, or where that pins
the CPU (an AOTInductor package), the sibling a GPU serves instead (serving/gpu_archive.py), so the
check's rows on every device run what `make deploy GPU=1` would. Where its weights are larger than
`max_weights_mib`, they stay behind and the check makes random ones of the same architecture there
(agreement and speed do not need trained weights), the same on every device:
- an eager archive (a state dict): the weights file is dropped;
- a serialised one (TorchScript, ONNX, an AOTInductor package, a variant this code does not know):
  the model's eager archive of the same entry is carried instead, its weights dropped; its source
  (a Hugging Face config, the model's Python files) is staged from the catalogue, and the variant's
  own settings are kept beside it. At check time a TorchScript variant is traced again from the
  random eager model (so its rows run the TorchScript graph), and an AOTInductor variant is
  exported and compiled again there, for that machine's CPU and torch (a package is compiled for one
  CPU and one torch; the archive runs on the CPU on a GPU host too); where that cannot be done (no
  C++ compiler there, an export refused) and for any other variant the eager model runs, and its
  rows say so and why.
The pack also holds TorchServe's Python package without its frontend (the handlers' metrics import
it). A pack over LIMIT_MIB is refused, naming its largest models.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from benchmarks.load.errors import BenchmarkError

RANDOM_WEIGHTS = "random-weights.json"  # a packed model's marker: make its weights at check time
SERVED_CONFIG = "model-config.variant.yaml"  # a re-made model's own model-config.yaml, for its re-trace
LIMIT_MIB = 60.0  # the device tool carries 64 MiB with the checkout; the rest is the checkout's


@dataclass(frozen=True)
class Packed:
    model: str
    variant: str  # the packed archive's variant
    how: str  # "as built" | "random weights" | "re-made from source"
    mib: float


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def read_config(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "model-config.yaml").read_text())


def pack(catalogue: Path, store: Path, into: Path, max_weights_mib: float) -> list[Packed]:
    import ts

    from build.catalogue import Catalogue
    from serving.fake_context import extract
    from serving.gpu_archive import served_on_gpu

    cat = Catalogue.load(catalogue)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    shutil.copytree(Path(ts.__file__).parent, into / "site" / "ts",
                    ignore=shutil.ignore_patterns("frontend", "__pycache__", "*.jar"))
    packed = []
    for model in cat.names:
        entry = cat.entry(model)
        default = store / entry.default_variant.archive_name(model)
        if not default.is_file():
            raise BenchmarkError(f"{default} is not built (make build)")
        folder = extract(served_on_gpu(default, model), into / model)  # what a GPU host serves
        config = read_config(folder)
        variant = config["handler"].get("variant") or entry.default_variant.name
        weights = folder / config["handler"]["weights"]
        how = "as built"
        # An AOTInductor package runs on the CPU and torch that compiled it: always made again there.
        compiled = config["handler"]["runtime"].get("graph") == "aoti"
        if compiled or weights.stat().st_size > max_weights_mib * 2**20:
            if config["handler"].get("source") is not None:  # an eager archive: the architecture is in it
                weights.unlink()
                how = "random weights"
            else:
                remake(entry, folder, catalogue.parent, config)
                how = "re-made from source"
            (folder / RANDOM_WEIGHTS).write_text(json.dumps({"dropped": weights.name, "how": how}) + "\n")
        packed.append(Packed(model, variant, how, folder_mib(folder)))
    total = folder_mib(into)
    if total > LIMIT_MIB:
        largest = ", ".join(f"{p.model} {p.mib:.1f} MiB" for p in sorted(packed, key=lambda p: -p.mib)[:3])
        raise BenchmarkError(f"the pack is {total:.1f} MiB, over {LIMIT_MIB:g} (largest: {largest}): "
                             "lower --max-weights-mib")
    return packed


def remake(entry, folder: Path, root: Path, config: dict[str, Any]) -> None:
    """A serialised archive as its entry's eager archive without weights: the variant's
    model-config.yaml kept as SERVED_CONFIG, the eager one written, the source staged."""
    from build.export import handler_section
    from build.variants import KINDS, Variant

    (folder / SERVED_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    (folder / config["handler"]["weights"]).unlink()
    eager = {**config, "handler": handler_section(entry, Variant("eager", KINDS["eager"], default=True))}
    eager["handler"]["variant"] = config["handler"].get("variant") or "eager"
    (folder / "model-config.yaml").write_text(yaml.safe_dump(eager, sort_keys=False))
    entry.model.stage(root, folder)


def what_runs(folder: Path) -> Optional[str]:
    """How a packed model's weights are made at check time; None: its own weights."""
    marker = folder / RANDOM_WEIGHTS
    return json.loads(marker.read_text())["how"] if marker.is_file() else None


def random_weights(folder: Path) -> str:
    """The archive's architecture with seeded random weights, written where its weights belong; a
    re-made TorchScript variant traced again from them. Returns what its rows run, for the report."""
    import torch

    from handlers.families import family_class
    from handlers.self_check import FILE as SELF_CHECK_FILE
    from handlers.settings import HandlerSettings

    settings = HandlerSettings.from_mapping(read_config(folder)["handler"])
    family = family_class(settings.family)(settings.family_settings, folder)
    torch.manual_seed(0)
    model = family.wrap(settings.source.build(folder))
    # The archive's load-time self-check holds for the weights it shipped with, not for these.
    (folder / SELF_CHECK_FILE).unlink(missing_ok=True)
    served = folder / SERVED_CONFIG
    if not served.is_file():
        torch.save(model.state_dict(), folder / settings.weights)
        return f"{settings.variant or 'eager'}, random weights"
    variant_config = yaml.safe_load(served.read_text())
    variant = variant_config["handler"].get("variant") or "?"
    graph = variant_config["handler"]["runtime"].get("graph")
    if graph == "torchscript":
        _retrace(folder, model.eval(), family, variant_config)
        return f"{variant}, re-traced here from random weights"
    if graph == "aoti":
        why = _recompile(folder, model.eval(), family, variant_config)
        if why is None:
            return f"{variant}, exported and compiled here from random weights"
        torch.save(model.state_dict(), folder / settings.weights)
        return f"eager in place of {variant} ({why}), random weights"
    # No way to re-make this serialisation here: the eager model runs in its place, and says so.
    torch.save(model.state_dict(), folder / settings.weights)
    return f"eager in place of {variant}, random weights"


def _retrace(folder: Path, model, family, variant_config: dict[str, Any]) -> None:
    import torch

    from build.export import torch_int8, trace
    from handlers import runtime
    from handlers.settings import HandlerSettings

    rt = variant_config["handler"]["runtime"]
    if runtime.resolve_precision(rt.get("precision", "fp32"), torch.device("cpu")) is None:
        rt["precision"] = "fp32"  # traced as this CPU runs it: the label follows
    settings = HandlerSettings.from_mapping(variant_config["handler"])
    if variant_config["handler"].get("variant") == "int8":
        model = torch_int8(model)
    torch.jit.save(trace(model, family, settings), str(folder / settings.weights))
    (folder / "model-config.yaml").write_text(yaml.safe_dump(variant_config, sort_keys=False))
    (folder / SERVED_CONFIG).unlink()


def _recompile(folder: Path, model, family, variant_config: dict[str, Any]) -> Optional[str]:
    """The AOTInductor package made again here from `model`; None, or why it could not be."""
    import torch

    from build.aoti_export import export_aoti
    from build.errors import ExportError
    from handlers import runtime
    from handlers.settings import HandlerSettings

    rt = variant_config["handler"]["runtime"]
    dtype = runtime.resolve_precision(rt.get("precision", "fp32"), torch.device("cpu"))
    if dtype is None:
        rt["precision"] = "fp32"  # compiled as this CPU runs it: the label follows
    settings = HandlerSettings.from_mapping(variant_config["handler"])
    example = family.example_batch(2)
    try:
        export_aoti(model, example if isinstance(example, tuple) else (example,), folder / settings.weights, dtype,
                    f"{folder.name} variant aoti (device check)")
    except ExportError as err:
        return str(err)[:300]
    (folder / "model-config.yaml").write_text(yaml.safe_dump(variant_config, sort_keys=False))
    (folder / SERVED_CONFIG).unlink()
    return None
