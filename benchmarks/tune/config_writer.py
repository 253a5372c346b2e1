"""Write tuned per-model values into config.properties: the `models=` stanza and nothing else.

Every other line (properties, comments, blank lines) stays byte for byte as it was. Inside the
stanza only the tuned models' batchSize / maxBatchDelay / minWorkers / maxWorkers change; other
models, other versions and any other keys of an entry are kept. Next to the stanza (directly
above it) each tuned model gets a provenance record, replaced when it is tuned again:

    # tuned minilm: 2026-11-21 07:12 UTC, SLO p99 <= 50 ms: batchSize 4, maxBatchDelay 2 ms, ...
    #   measured: 123.4 req/s at p99 45.6 ms (verified; TorchServe defaults 60.1 req/s)
    #   report benchmarks/reports/tune-minilm-...; machine AMD EPYC, 2 cores, torch ...

Refusal: a model-config.yaml inside a model's archive that sets frontend keys (batchSize,
maxBatchDelay, minWorkers, maxWorkers, responseTimeout) overrides config.properties, so writing
tuned values there would change nothing the server does: the writer refuses and says which
archive and keys are to blame.

Snapshots: a plain `torchserve --start` (no --ts-config, no --ncs) loads the newest snapshot in
logs/config/ instead of config.properties, so a re-tuned file would silently lose to the old
values. Writing the file removes the snapshots a start from its folder would load.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.tune.errors import ConfigWriteError
from handlers.plan import THREADS_KEY
from handlers.runtime import usable_cores
from serving import properties
from serving.errors import LauncherError
from serving.mix_record import read_mix
from serving.plan_check import plan_problems
from serving.repo import MODEL_STORE
from serving.ts_config import TUNED_KEYS, ModelSettings, ServerConfig

HEADER = "# Tuner provenance (python -m benchmarks.tune): one record per tuned model, for its values in models= below."
RECORD_PREFIX = "# tuned "
RECORD_MORE = "#   "  # the record's further lines
# TorchServe's own rule for model names, and what keeps the stanza free of properties escapes.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_IDENTITY_KEYS = ("defaultVersion", "marName")


@dataclass(frozen=True)
class Update:
    """Tuned values for one model (the version is used only for a new entry; an archive name, when
    given, becomes the entry's marName and its load_models item)."""

    name: str
    settings: ModelSettings
    version: str = "1.0"
    archive: str = ""

    def apply(self, entry: dict[str, object]) -> dict[str, object]:
        values = self.settings.to_json()
        out = dict(entry)
        for key in TUNED_KEYS:
            out[key] = values[key]
        # The thread plan goes with the values it was measured with; an old one never outlives them.
        out.pop(THREADS_KEY, None)
        if THREADS_KEY in values:
            out[THREADS_KEY] = values[THREADS_KEY]
        out.setdefault("responseTimeout", values["responseTimeout"])
        if self.archive:  # the tuner's chosen variant (build/variants.py): its archive is what loads
            out["marName"] = self.archive
        return out


@dataclass(frozen=True)
class Provenance:
    """Where a model's tuned values came from. One comment line in config.properties."""

    model: str
    date: str
    slo_ms: float
    settings: ModelSettings
    threads: int
    throughput_rps: float
    p99_ms: float
    verified: str  # "verified", "search only", "verification FAILED ..."
    defaults_rps: Optional[float]
    report: str
    machine: str
    unit: str = "req/s"  # a generating model: tokens/s
    latency: str = "p99"  # a generating model: "TTFT p99"

    def lines(self) -> tuple[str, ...]:
        s = self.settings
        workers = f"{s.min_workers} worker{'s' if s.min_workers > 1 else ''} x {self.threads} thread" + (
            "s" if self.threads > 1 else "")
        defaults = "" if self.defaults_rps is None else f"; TorchServe defaults {self.defaults_rps:.1f} {self.unit}"
        text = (
            f"{RECORD_PREFIX}{self.model}: {self.date}, SLO {self.latency} <= {self.slo_ms:g} ms: batchSize {s.batch_size}, "
            f"maxBatchDelay {s.max_batch_delay_ms} ms, {workers}",
            f"{RECORD_MORE}measured: {self.throughput_rps:.1f} {self.unit} at {self.latency} {self.p99_ms:.1f} ms "
            f"({self.verified}{defaults})",
            f"{RECORD_MORE}report {self.report}; machine {self.machine}",
        )
        # A newline inside a value (a report path, a CPU name) must not end the comment early.
        return tuple(t.replace("\r", " ").replace("\n", " ") for t in text)


# -- reading the file ---------------------------------------------------------------------------
def _logical_spans(lines: Sequence[str]) -> list[tuple[int, int]]:
    """(first, end) physical line ranges of each property (continuations included); comments and
    blank lines belong to none."""
    spans, i = [], 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped[0] in "#!":
            i += 1
            continue
        first = i
        while True:
            body = lines[i].rstrip("\r\n")
            trailing = len(body) - len(body.rstrip("\\"))
            i += 1
            if trailing % 2 == 0 or i >= len(lines):
                break
        spans.append((first, i))
    return spans


def find_stanza(lines: Sequence[str]) -> Optional[tuple[int, int]]:
    """The physical lines of the (last) `models` property, as Java would read it."""
    found = None
    for first, end in _logical_spans(lines):
        keys = list(properties.parse("".join(lines[first:end])))
        if keys == ["models"]:
            found = (first, end)
    return found


def _record_model(line: str) -> Optional[str]:
    """The model a provenance record's first line is about, or None for any other line."""
    if not line.startswith(RECORD_PREFIX):
        return None
    return line[len(RECORD_PREFIX):].split(":", 1)[0]


# -- the stanza ---------------------------------------------------------------------------------
def _items(mapping: Mapping[str, object]) -> str:
    return ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in mapping.items())


def _version_text(version: str, body: Mapping[str, object], indent: str) -> str:
    head = {k: v for k, v in body.items() if k in _IDENTITY_KEYS}
    rest = {k: v for k, v in body.items() if k not in _IDENTITY_KEYS}
    if head and rest:
        return f"{json.dumps(version)}: {{{_items(head)},\\\n{indent}  {_items(rest)}}}"
    return f"{json.dumps(version)}: {{{_items(body)}}}"


def format_stanza(models: Mapping[str, Mapping[str, Mapping[str, object]]], newline: str = "\n") -> str:
    """`models=` over several lines (backslash continuations; Java drops the indentation)."""
    out = ["models={\\"]
    names = list(models)
    for index, name in enumerate(names):
        versions = models[name]
        end = "\\" if index == len(names) - 1 else ",\\"
        if len(versions) == 1:
            (version, body), = versions.items()
            out.append(f"  {json.dumps(name)}: {{{_version_text(version, body, '  ')}}}{end}")
        else:
            out.append(f"  {json.dumps(name)}: {{\\")
            parts = [f"    {_version_text(v, b, '    ')}" for v, b in versions.items()]
            out.append(",\\\n".join(parts) + "}" + end)
    out.append("  }")
    return newline.join("\n".join(out).split("\n")) + newline


def _parse_models(text: str) -> dict[str, dict[str, dict[str, object]]]:
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigWriteError(f"models= is not valid JSON ({exc}): fix it by hand before tuning") from exc
    if not isinstance(raw, dict) or not all(isinstance(v, dict) and all(isinstance(b, dict) for b in v.values())
                                            for v in raw.values()):
        raise ConfigWriteError('models= must be {"<name>": {"<version>": {...}}}: fix it by hand before tuning')
    return raw


def updated_models(current: dict[str, dict[str, dict[str, object]]],
                   updates: Sequence[Update]) -> dict[str, dict[str, dict[str, object]]]:
    out = {name: dict(versions) for name, versions in current.items()}
    for update in updates:
        if not _NAME.match(update.name):
            raise ConfigWriteError(f"model name {update.name!r} is not a valid TorchServe model name")
        versions = out.get(update.name)
        if not versions:
            entry = {"defaultVersion": True, "marName": update.archive or f"{update.name}.mar"}
            out[update.name] = {update.version: update.apply(entry)}
            continue
        default = next((v for v, body in versions.items() if body.get("defaultVersion")), next(iter(versions)))
        versions[default] = update.apply(versions[default])
    return out


# -- the whole file -----------------------------------------------------------------------------
def rewrite(text: str, updates: Sequence[Update], records: Sequence[Provenance] = ()) -> str:
    """The new text of a config.properties: stanza and provenance lines changed, all else kept."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    stanza = find_stanza(lines)
    current = _parse_models(properties.parse(text).get("models", "")) if stanza else {}
    models = updated_models(current, updates)
    tuned = {r.model: [line + newline for line in r.lines()] for r in records}
    kept_records: dict[str, list[str]] = {}
    body: list[str] = []
    insert_at = None
    record: Optional[list[str]] = None  # the record whose lines are being read
    for index, line in enumerate(lines):
        if stanza and stanza[0] <= index < stanza[1]:
            if index == stanza[0]:
                insert_at = len(body)
            record = None
            continue
        if line.rstrip("\r\n") == HEADER:
            record = None
            continue
        model = _record_model(line)
        if model is not None:
            record = kept_records.setdefault(model, [])
            record[:] = [line]
            continue
        if record is not None and line.startswith(RECORD_MORE):
            record.append(line)
            continue
        record = None
        body.append(line)
    if insert_at is None:  # no stanza yet: a new one at the end, after a blank line
        if body and body[-1].strip():
            body.append(newline)
        insert_at = len(body)
    kept_records.update(tuned)
    block: list[str] = []
    if kept_records:
        order = list(models) + [m for m in kept_records if m not in models]
        block.append(HEADER + newline)
        block += [line for m in order if m in kept_records for line in kept_records[m]]
    block.append(format_stanza(models, newline))
    return "".join(with_load_models(body[:insert_at], models, newline) + block
                   + with_load_models(body[insert_at:], models, newline))


LOAD_MODELS = "load_models="


def with_load_models(lines: list[str], models: Mapping[str, Mapping[str, Mapping[str, object]]],
                     newline: str) -> list[str]:
    """The load_models line listing each models= entry's archive (its default version's marName):
    TorchServe loads what load_models names and only that, so a variant chosen in marName loads and
    its sibling archives in the store do not (load_models=all would register them all)."""
    items = []
    for name, versions in models.items():
        body = next((b for b in versions.values() if b.get("defaultVersion")), next(iter(versions.values())))
        items.append(f"{name}={body.get('marName') or name + '.mar'}")
    return [LOAD_MODELS + ",".join(items) + newline if line.startswith(LOAD_MODELS) else line for line in lines]


def check_archives(archives: Mapping[str, Path]) -> None:
    """Refuse when an archive's model-config.yaml sets frontend keys that override config.properties."""
    from build.archive import archived_frontend_keys

    problems = []
    for name, archive in archives.items():
        if not Path(archive).is_file():
            raise ConfigWriteError(f"{name}: archive {archive} not found (build it: .venv/bin/python -m build)")
        keys = archived_frontend_keys(Path(archive)) or []
        if keys:
            problems.append(f"{archive} (model {name}) sets {', '.join(keys)} in its model-config.yaml")
    if problems:
        raise ConfigWriteError(
            "refusing to write config.properties: " + "; ".join(problems) + ". TorchServe lets an archive's "
            "model-config.yaml override config.properties, so the tuned values would not take effect. Remove these "
            "keys from the archive (catalogue.yaml settings are for the handler section only), rebuild, and tune "
            "again.")


SNAPSHOT_NAME = re.compile(r"^\d{17}-.*\.cfg$")  # TorchServe's <yyyyMMddHHmmssSSS>-<kind>.cfg


def snapshot_folder(config: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """Where a `torchserve --start` run from the config's folder keeps its snapshots."""
    return Path(config).resolve().parent / environ.get("LOG_LOCATION", "logs") / "config"


def remove_snapshots(config: Path, environ: Mapping[str, str] = os.environ) -> tuple[Path, ...]:
    """Delete the snapshots that would replace `config` on a plain start; the removed paths."""
    folder = snapshot_folder(config, environ)
    try:
        stale = tuple(sorted(f for f in folder.iterdir() if f.is_file() and SNAPSHOT_NAME.match(f.name)))
    except OSError:
        return ()
    for snapshot in stale:
        snapshot.unlink()
    return stale


def write_config(path: Path, updates: Sequence[Update], records: Sequence[Provenance] = (),
                 archives: Optional[Mapping[str, Path]] = None,
                 rewrite_text: Optional[Callable[[str], str]] = None, check_plan: bool = True) -> str:
    """Check the archives, rewrite `path` in place (atomically), remove the TorchServe snapshots that
    would replace it on a plain start, and return the new text.
    `rewrite_text`: the new text from the old (default: `rewrite` with these updates and records).
    `check_plan`: warn of what no longer holds in the whole file; off for a rewrite that changes
    provenance only (its plan was checked when it was first written)."""
    if archives is not None:
        check_archives(archives)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigWriteError(f"cannot read {path}: {exc}") from exc
    new = rewrite_text(text) if rewrite_text is not None else rewrite(text, updates, records)
    written = _parse_models(properties.parse(new).get("models", ""))
    for update in updates:  # read back as TorchServe and the workers will, before the file is replaced
        versions = written.get(update.name) or {}
        default = next((b for b in versions.values() if b.get("defaultVersion")), next(iter(versions.values()), {}))
        if update.settings.mismatches(default) or default.get(THREADS_KEY) != update.settings.threads:
            raise ConfigWriteError(f"internal error: {update.name}'s values do not read back from the new text")
    tmp = path.with_name(f".{path.name}.tuner-tmp")
    tmp.write_text(new, encoding="utf-8", newline="")
    os.replace(tmp, path)
    removed = remove_snapshots(path)
    if removed:
        print(f"[tune] removed {len(removed)} TorchServe snapshot(s) from {removed[0].parent}: a plain "
              f"`torchserve --start` would have loaded them instead of the new {path.name}", file=sys.stderr)
    if check_plan:
        for problem in written_plan_problems(path):
            print(f"[tune] warning: {path.name}: {problem}", file=sys.stderr)
    return new


def written_plan_problems(path: Path) -> list[str]:
    """What no longer holds in the whole written file (serving/plan_check.py): a model tuned alone
    re-checks the cores budget of everything load_models loads, and the mix record against it."""
    config = ServerConfig.load(path)
    try:
        loaded = list(config.startup_archives(MODEL_STORE))
        record = read_mix(path)
    except LauncherError as err:
        return [str(err)]
    return plan_problems(config, loaded, record, usable_cores())
