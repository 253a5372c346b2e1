"""The build report: one line per variant of every model built, model_store/build_report.{json,md}.

A line: the variant, its archive (or "not archived": the gate rejected it), the gate's worst case,
the served weights' size and its in-process items/s on one thread at batch 1 and 8. Other tools
(the tuner, the in-process benchmark) read the JSON to learn which variants exist and passed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from build.archive import BuildResult, VariantResult

REPORT = "build_report"


def lines(result: BuildResult) -> list[str]:
    out = []
    for v in result.variants:
        where = v.archive.name if v.archive else "not archived"
        speed = " / ".join(f"{v.items_per_s.get(k, 0):.1f}" for k in ("1", "8"))
        out.append(f"| {result.name} | {v.variant} | {where} | {v.gate or 'no eager reference: not gated'} | "
                   f"{v.size_mib:.2f} | {speed} |")
    return out


def write(store: Path, results: Iterable[BuildResult]) -> Path:
    """Merge these models' lines into the store's report (other models' lines, and the lines of
    variants a build skipped, are kept)."""
    path = store / f"{REPORT}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    models: dict[str, list] = data.get("models", {})
    for result in results:
        models[result.name] = _merged(models.get(result.name, []), result)
    data = {"written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "models": models}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
    md = ["# Build report", "", f"Written {data['written']} by `make build` (python -m build).",
          "In-process items/s on one thread, the entry's first example, batch 1 / 8; the gate compares each "
          "variant with the fp32 eager model (build/gate.py).", "",
          "| model | variant | archive | accuracy gate | weights MiB | items/s b1 / b8 |", "|---|---|---|---|---|---|"]
    for name, entries in models.items():
        md.extend(lines(BuildResult(name, Path(), False, variants=tuple(
            VariantResult.from_json(e, store) for e in entries))))
    (store / f"{REPORT}.md").write_text("\n".join(md) + "\n")
    return path


def _merged(old: list[dict], result: BuildResult) -> list[dict]:
    """The model's lines after this build: a variant it skipped keeps its earlier line, if any,
    in its earlier place."""
    new = {v.variant: v.to_json() for v in result.variants}
    if not result.skipped:
        return list(new.values())
    kept = [new.pop(line["variant"], line) for line in old
            if line.get("variant") in result.skipped or line.get("variant") in new]
    return kept + list(new.values())


def read(store: Path) -> dict[str, list[VariantResult]]:
    """Model -> its variants' lines, from the last build (empty when none was written)."""
    try:
        data = json.loads((store / f"{REPORT}.json").read_text())
    except (OSError, ValueError):
        return {}
    return {name: [VariantResult.from_json(e, store) for e in entries] for name, entries in data["models"].items()}
