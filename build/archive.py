"""Stage an entry's files and package them with torch-model-archiver's Python API.

Every archive runs the same handler (handlers/handler.py, the request loop) with the handlers
package beside it; the entry's family, settings and source go into its model-config.yaml. A gated
variant also carries its self-check (handlers/self_check.py): a few held-out inputs and fp32's
outputs for them, on which the worker checks the variant again on the machine that serves it.

Incremental: a content hash of every input (catalogue entry, handler package, the model's source
files and weights, extra files, tool versions) is recorded per archive; an unchanged archive is not
rebuilt (the CPU's int8 instructions count among the inputs: the gate's verdict is this host's).
A new archive is written next to the store and moved in only when complete, so a failed
build leaves the old one intact.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import yaml

import handlers
from build import aoti_export, export, gate
from build.catalogue import COMPILE_STARTUP_TIMEOUT_S, STARTUP_TIMEOUT_S, Catalogue, ModelEntry, startup_timeout_s
from build.errors import CatalogueError, ExportError
from build.held_out import separation
from build.sources import TorchScriptFile
from build.speed import SECONDS, inprocess_speed
from build.variants import Variant
from handlers import runtime, self_check
from handlers.settings import SERIALISED_GRAPHS, HandlerSettings

STATE_FILE = ".build-state.json"
HANDLERS = Path(handlers.__file__).resolve().parent  # the package every archive carries


@dataclass(frozen=True)
class VariantResult:
    """One variant's line of the build report."""

    variant: str
    archive: Optional[Path]  # None: the gate rejected it (not archived)
    gate: Optional[str]  # the gate's verdict, in words (None: no eager reference to gate against)
    gate_worst: Optional[float]
    size_mib: float  # the served weights file
    items_per_s: Mapping[str, float]  # in-process, one thread: {"1": .., "8": ..} per batch size
    rebuilt: bool

    def to_json(self) -> dict:
        return {"variant": self.variant, "archive": self.archive.name if self.archive else None, "gate": self.gate,
                "gate_worst": self.gate_worst, "size_mib": self.size_mib, "items_per_s": dict(self.items_per_s)}

    @classmethod
    def from_json(cls, data: Mapping, store: Path) -> VariantResult:
        archive = store / data["archive"] if data.get("archive") else None
        return cls(data["variant"], archive, data.get("gate"), data.get("gate_worst"), float(data["size_mib"]),
                   dict(data.get("items_per_s") or {}), rebuilt=False)


@dataclass(frozen=True)
class BuildResult:
    name: str
    archive: Path  # the default variant's (not built when `skipped` holds it)
    rebuilt: bool
    seconds: float = 0.0
    variants: tuple[VariantResult, ...] = ()  # the variants asked for
    skipped: tuple[str, ...] = ()  # variants not asked for: their archives and state left as they were
    pinned: Optional[str] = None  # the variant the catalogue pins for make tune (variants: [{x: {pin: true}}])

    @property
    def archives(self) -> dict[str, Path]:
        """Variant -> archive, for the variants that passed the gate."""
        return {v.variant: v.archive for v in self.variants if v.archive is not None}


def handler_package_files() -> Iterable[Path]:
    return sorted(p for p in HANDLERS.rglob("*.py") if "__pycache__" not in p.parts)


def input_hash(entry_raw, root: Path, sources: Iterable[Path], extras: Iterable[Path]) -> str:
    from model_archiver.version import __version__ as archiver_version

    digest = hashlib.sha256()
    digest.update(json.dumps(entry_raw, sort_keys=True, default=str).encode())
    digest.update(f"torch={torch.__version__} archiver={archiver_version}".encode())
    # A TorchScript graph is traced at the precision this CPU runs natively: another CPU, another graph.
    digest.update(f"native bf16={runtime.cpu_supports(torch.bfloat16)} fp16={runtime.cpu_supports(torch.float16)}".encode())
    # Which int8 kernels run (VNNI or not) moves an int8 variant's answers: the gate's verdict is per host.
    digest.update(f"int8={','.join(self_check.int8_features())}".encode())
    digest.update(f"startupTimeout={STARTUP_TIMEOUT_S},{COMPILE_STARTUP_TIMEOUT_S}".encode())
    for path in [*handler_package_files(), *sources, *extras]:
        digest.update(str(path.name).encode())
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _read_state(store: Path) -> dict:
    try:
        return json.loads((store / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(store: Path, key: str, digest: str, line: VariantResult) -> None:
    state = _read_state(store)
    state[key] = {"digest": digest, "report": line.to_json()}
    tmp = store / f"{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, store / STATE_FILE)


def stage_files(stage: Path, extras: dict) -> Path:
    """Lay out what goes inside the archive; returns the folder passed as extra_files.

    torch-model-archiver copies an extra-files folder's *contents* to the archive root, keeping
    sub-folders: so `handlers/` goes in one level down and arrives with its structure intact.
    """
    content = stage / "content"
    shutil.copytree(HANDLERS, content / "handlers", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, source in extras.items():
        shutil.copy2(source, content / name)
    return content


def generate_archive(config, stage: Path) -> None:
    """ModelArchiver.generate_model_archive with its scratch folder inside `stage`.

    The archiver stages into tempfile.gettempdir()/<model name> and deletes that folder first:
    pointing it at our private stage keeps parallel builds and unrelated /tmp folders safe.
    """
    from model_archiver.model_archiver import ModelArchiver

    saved, tempfile.tempdir = tempfile.tempdir, str(stage)
    try:
        ModelArchiver.generate_model_archive(config)
    finally:
        tempfile.tempdir = saved


def package(entry: ModelEntry, stage: Path, content: Path, weights: Path, out: Path, handler: str) -> Path:
    """`handler`: the handler file TorchServe runs, relative to `content` (the family's entry)."""
    from model_archiver.model_archiver_config import ModelArchiverConfig

    config = ModelArchiverConfig(
        model_name=entry.name,  # every variant under the model's own name: clients keep its URL
        handler=str(content / handler),
        version=entry.version,
        serialized_file=str(weights),
        extra_files=str(content),
        export_path=str(out),
        config_file=str(stage / "model-config.yaml"),
        force=True,
    )
    generate_archive(config, stage)
    return out / f"{entry.name}.mar"


def build_entry(catalogue: Catalogue, name: str, root: Path, store: Path, force: bool = False,
                progress=print, only: Optional[Iterable[str]] = None, speed_seconds: float = SECONDS) -> BuildResult:
    """Every variant of the entry whose inputs changed: exported, tried, gated, archived.

    `only`: these variants alone (names; None: all of them). The others' archives and recorded
    state are not touched, so a later full build still finds them up to date when they are.
    `speed_seconds`: how long each variant's speed is timed per batch size, for the build report.
    """
    started = time.perf_counter()
    entry = catalogue.entry(name)
    for variant in entry.variants:  # every variant's settings checked before anything is exported
        export.parse_settings(entry, export.handler_section(entry, variant))
    asked = entry.variants if only is None else _asked_variants(entry, only)
    extras = {e.name: e.source.resolve(root, f"model {name!r} extra file {e.name!r}") for e in entry.extra_files}
    held_out = [f.resolve(root, f"model {name!r} gate.held_out") for f in entry.gate.held_out]
    digest = input_hash(catalogue.raw_entries[name], root, entry.model.input_files(root), [*extras.values(), *held_out])
    if any(v.serialisation == "aoti" for v in entry.variants):  # compiled C++: the compiler is an input too
        digest = hashlib.sha256(f"{digest} cxx={aoti_export.compiler_version()} "
                                f"inductor={sorted(aoti_export.INDUCTOR_CONFIGS.items())}".encode()).hexdigest()
    state = _read_state(store)
    lines, todo = {}, []
    for variant in asked:
        key = variant.archive_name(name)
        saved = state.get(key)
        fresh = isinstance(saved, dict) and saved.get("digest") == digest
        line = VariantResult.from_json(saved["report"], store) if fresh else None
        if force or line is None or (line.archive is not None and not line.archive.is_file()):
            todo.append(variant)
        else:
            lines[variant.name] = line

    store.mkdir(parents=True, exist_ok=True)
    if todo:
        judge = gate_judge(entry, root, progress)
        for variant in todo:
            try:
                line = build_variant(entry, variant, root, store, extras, judge, progress, speed_seconds)
            except ExportError as err:
                if variant.default:
                    raise
                # A variant that does not export is reported and left out; the entry's others still build.
                (store / variant.archive_name(name)).unlink(missing_ok=True)
                progress(f"  {name} {variant.name}: not archived: {err}")
                line = VariantResult(variant.name, None, f"FAILED: export: {err}", None, 0.0, {}, rebuilt=True)
            _write_state(store, variant.archive_name(name), digest, line)
            lines[variant.name] = line
    results = tuple(lines[v.name] for v in asked)
    skipped = tuple(v.name for v in entry.variants if v not in asked)
    return BuildResult(name, store / entry.default_variant.archive_name(name), rebuilt=bool(todo),
                       seconds=time.perf_counter() - started, variants=results, skipped=skipped,
                       pinned=next((v.name for v in entry.variants if v.pin), None))


def _asked_variants(entry: ModelEntry, only: Iterable[str]) -> tuple[Variant, ...]:
    wanted = set(only)
    unknown = sorted(wanted - {v.name for v in entry.variants})
    if unknown:
        raise CatalogueError(f"model {entry.name!r} has no variant {unknown[0]!r} "
                             f"(its variants: {', '.join(v.name for v in entry.variants)})")
    return tuple(v for v in entry.variants if v.name in wanted)


def gate_judge(entry: ModelEntry, root: Path, progress) -> Optional[_Judge]:
    """Judges variants against the fp32 eager model (None where the entry has no eager model)."""
    if isinstance(entry.model, TorchScriptFile):
        return None
    return _Judge(entry, root, progress)


class _Judge:
    """The fp32 eager model, loaded once per entry, and its outputs on the gate's inputs."""

    def __init__(self, entry: ModelEntry, root: Path, progress) -> None:
        self.entry, self.root, self.progress = entry, root, progress
        self.reference = None
        self.reference_outputs = None
        self.owners: tuple[int, ...] = ()  # the gate input each output row is of
        where = f"model {entry.name!r}"
        apart = separation(entry.examples, entry.gate.held_out, entry.gate.calibration, root, where)
        if not apart.apart:
            raise CatalogueError(f"{where}: gate.held_out must be kept apart from the examples and the calibration "
                                 f"set: {apart.problem()}")
        self.inputs = gate.gate_inputs(entry.examples, entry.gate, root, where)
        progress(f"  {entry.name}: gate inputs: {apart.examples} example(s) + {apart.held_out} held out "
                 f"({apart.calibration} calibration input(s) kept apart)")

    def model(self, family) -> torch.nn.Module:
        if self.reference is None:
            self.reference = export.reference_model(self.entry, family, self.root)
        return self.reference

    def __call__(self, family, candidate, settings) -> gate.Verdict:
        if self.reference_outputs is None:
            self.progress(f"  {self.entry.name}: fp32 eager reference on {len(self.inputs)} gate input(s)")
            self.reference_outputs = gate.run_outputs(self.model(family), family, self.inputs)
            self.owners = gate.row_owners(family, self.inputs)
        outputs = gate.run_outputs(candidate, family, self.inputs, _autocast_dtype(settings))
        return gate.judge(family.gate_kind(), self.entry.gate, self.reference_outputs, outputs, self.inputs,
                          self.owners)

    def self_check(self, variant: Variant, family, candidate, settings: HandlerSettings,
                   verdict: gate.Verdict) -> tuple[self_check.SelfCheck, self_check.Agreement]:
        """The archive's self-check (the held-out inputs where this variant came nearest to the bound,
        fp32's outputs for them) and what it measures on this host, run as the worker will run it."""
        chosen = gate.self_check_inputs(verdict, self.inputs, self.entry.gate.self_check)
        packed = tuple(self_check.Packed(item.name, item.content_type, item.body) for item in chosen)
        reference, _ = self_check.outputs(packed, family, _forward(self.model(family), family, None))
        check = self_check.SelfCheck(self.entry.name, variant.name, family.gate_kind(), self.entry.gate.bounds, packed,
                                     reference, self_check.host(), 0.0)
        found = check.measure(family, _forward(candidate, family, _autocast_dtype(settings)))
        return dataclasses.replace(check, build_figure=found.figure), found


def _autocast_dtype(settings: HandlerSettings) -> Optional[torch.dtype]:
    """The autocast the worker runs the variant under (none for graphs that carry their precision)."""
    rt = settings.runtime
    return None if rt.graph in SERIALISED_GRAPHS else runtime.resolve_precision(rt.precision, torch.device("cpu"))


def _forward(model, family, dtype: Optional[torch.dtype]):
    """The worker's forward pass on one collated batch, on this host's CPU."""
    def infer(batch):
        with torch.inference_mode(), runtime.autocast(torch.device("cpu"), dtype):
            return model(*family.model_inputs(batch))
    return infer


def build_variant(entry: ModelEntry, variant: Variant, root: Path, store: Path, extras: dict, judge,
                  progress, speed_seconds: float = SECONDS) -> VariantResult:
    name, archive = entry.name, store / variant.archive_name(entry.name)
    section = export.handler_section(entry, variant)
    settings = export.parse_settings(entry, section)
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-", dir=store) as tmp:
        stage = Path(tmp)
        content = stage_files(stage, extras)
        stage_source = getattr(entry.model, "stage", None)
        if stage_source is not None:
            stage_source(root, content)
        family = export.make_family(entry, settings, content)
        progress(f"  {name}: exporting variant {variant.name} ({variant.kind.about})")
        reference = None if judge is None else copy.deepcopy(judge.model(family))
        served = export.export(entry, variant, settings, family, root, content, reference)
        progress(f"  {name} {variant.name}: trying it on its family's batch and {len(entry.examples)} example(s)")
        for problem in export.smoke_test(entry, family, served, settings, root):
            progress(f"  {name}: warning: {problem}")
        verdict, rejected = None, None
        if judge is not None and judge.inputs:
            candidate = export.load_served(served, settings, family, root)
            verdict = judge(family, candidate, settings)
            progress(f"  {name} {variant.name}: gate {verdict.summary}")
            rejected = None if verdict.passed else verdict.summary
            if verdict.passed and entry.gate.self_check and verdict.order:
                check, found = judge.self_check(variant, family, candidate, settings, verdict)
                progress(f"  {name} {variant.name}: self-check packed: {check.summary(found)}")
                if not found.passed:  # it would refuse to load on the host that built it
                    rejected = f"FAILED: self-check {check.summary(found)}; the gate: {verdict.summary}"
                    verdict = dataclasses.replace(verdict, worst=found.figure)
                else:
                    (content / self_check.FILE).write_text(json.dumps(check.to_json()), encoding="utf-8")
        else:
            progress(f"  {name} {variant.name}: not gated: " + (
                "the source is a TorchScript file, served as it is: there is no eager model to compare it with"
                if judge is None else "no examples and no gate.held_out to compare outputs on"))
        speed = inprocess_speed(entry, family, lambda: export.load_served(served, settings, family, root), settings,
                                root, speed_seconds)
        size = served.stat().st_size / 2**20
        if rejected is not None:
            if variant.default:
                raise ExportError(f"the default variant {variant.name!r} fails the accuracy gate: {rejected}")
            archive.unlink(missing_ok=True)  # never leave an older, gated-out archive of it behind
            progress(f"  {name} {variant.name}: not archived (the gate rejected it)")
            return VariantResult(variant.name, None, rejected, verdict.worst, size, speed, rebuilt=True)
        served = Path(shutil.move(str(served), stage / served.name))
        model_config = {**family.archive_keys(family.settings), **export.device_keys(section),
                        "startupTimeout": startup_timeout_s(variant.kind.graph), "handler": section}
        (stage / "model-config.yaml").write_text(yaml.safe_dump(model_config, sort_keys=False))
        progress(f"  {name} {variant.name}: archiving")
        out = stage / "out"
        out.mkdir()
        built = package(entry, stage, content, served, out, family.handler_entry(family.settings))
        os.replace(built, archive)
    return VariantResult(variant.name, archive, verdict.summary if verdict else None,
                         verdict.worst if verdict else None, size, speed, rebuilt=True)


def archived_frontend_keys(archive: Path) -> Optional[list]:
    """Frontend keys found in an archive's model-config.yaml (they would override config.properties)."""
    import zipfile

    from build.catalogue import FRONTEND_KEYS

    with zipfile.ZipFile(archive) as mar:
        names = [n for n in mar.namelist() if n.endswith("model-config.yaml")]
        if not names:
            return []
        config = yaml.safe_load(mar.read(names[0])) or {}
    return [key for key in FRONTEND_KEYS if key in config]
