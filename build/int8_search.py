"""`python -m build.int8_search --model minilm`: which MatMuls to keep in fp32 for onnx-int8 to pass its gate.

Greedy sensitivity search on a calibration set (kept apart from the gate's held-out inputs, so the
gate still tests what the search did not see): start with every MatMul/Gemm weight in int8; at each
step try leaving each remaining node in fp32 and keep the one that raises the gate's worst case most;
stop when the calibration set passes with `--margin` to spare. Each trial is a quantisation and a
pass over the calibration set, so this takes minutes: run it once, paste the printed list into the
catalogue's `onnx-int8: {keep_fp32: [...]}`, and the build (seconds) checks it on the held-out set.
The calibration set is the entry's `gate.calibration` unless `--calibration` names other files. The
graph is exported as the build exports it (build/onnx_export.py), so the node names are the build's.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from build import export, gate
from build.catalogue import Catalogue
from build.errors import BuildError
from build.files import FileSource
from build.onnx_export import export_onnx, matmul_nodes, quantize_int8
from handlers.onnx_session import load_onnx

ROOT = Path(__file__).resolve().parent.parent


def worst_case(verdict: gate.Verdict) -> float:
    """Higher is better, whatever the family's measure."""
    return -verdict.worst if verdict.measure == "max tolerance ratio" else verdict.worst


def search(model: str, calibration: Sequence[Path], margin: float, max_steps: int, catalogue_path: Path,
           say=print) -> list[str]:
    catalogue = Catalogue.load(catalogue_path)
    entry = catalogue.entry(model)
    settings = export.served_settings(entry)
    with tempfile.TemporaryDirectory(prefix="int8-search-") as tmp:
        work = Path(tmp)
        family = export.make_family(entry, settings, _content(entry, work))
        files = (tuple(FileSource(None, None, str(p.resolve())) for p in calibration) if calibration
                 else entry.gate.calibration)
        if not files:
            raise BuildError(f"model {model!r}: no calibration inputs: give --calibration, or list them in "
                             "the entry's gate.calibration")
        spec = dataclasses.replace(entry.gate, held_out=files)
        kind = family.gate_kind()
        inputs = gate.gate_inputs((), spec, catalogue_path.parent, f"model {model!r} calibration")
        reference = export.reference_model(entry, family, catalogue_path.parent)
        say(f"{model}: fp32 reference on {len(inputs)} calibration input(s)")
        expected = gate.run_outputs(reference, family, inputs)
        batch = family.example_batch(2)
        fp32 = export_onnx(reference, batch if isinstance(batch, tuple) else (batch,), work / "fp32.onnx")
        candidates = list(matmul_nodes(fp32))
        needed = spec.min_cosine + margin  # embeddings; the other measures stop at a pass

        def trial(keep: list[str]) -> gate.Verdict:
            quantized = quantize_int8(fp32, work / "int8.onnx", keep)
            got = gate.run_outputs(load_onnx(quantized, torch.get_num_threads()), family, inputs)
            return gate.judge(kind, spec, expected, got, inputs)

        keep: list[str] = []
        verdict = trial(keep)
        say(f"all {len(candidates)} MatMul/Gemm weights in int8: {verdict.summary}")
        while not _good_enough(verdict, kind, needed) and len(keep) < max_steps:
            started, best = time.perf_counter(), None
            for i, node in enumerate(c for c in candidates if c not in keep):
                tried = trial(keep + [node])
                if best is None or worst_case(tried) > worst_case(best[1]):
                    best = (node, tried)
                print(f"\r  step {len(keep) + 1}: {i + 1}/{len(candidates) - len(keep)} tried", end="", flush=True)
            keep.append(best[0])
            verdict = best[1]
            say(f"\r  step {len(keep)}: keep {best[0]} in fp32 -> {verdict.summary} "
                f"({time.perf_counter() - started:.0f}s)")
    return keep


def _good_enough(verdict: gate.Verdict, kind: str, needed_cosine: float) -> bool:
    return verdict.passed and (kind != "embedding" or verdict.worst >= needed_cosine)


def _content(entry, work: Path) -> Path:
    """The files the family reads (tokenizer, labels), as the build stages them."""
    from build.archive import stage_files

    extras = {e.name: e.source.resolve(ROOT, f"extra file {e.name}") for e in entry.extra_files}
    content = stage_files(work / "stage", extras)
    stage_source = getattr(entry.model, "stage", None)
    if stage_source is not None:
        stage_source(ROOT, content)
    return content


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.int8_search", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--calibration", type=Path, action="append", default=[],
                        help="inputs the search may look at (.txt: a text per line; .npy; images); never the "
                             "gate's held-out files (default: the entry's gate.calibration)")
    parser.add_argument("--margin", type=float, default=0.003,
                        help="embeddings: stop at min cosine >= the gate's + this (default 0.003)")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--catalogue", type=Path, default=ROOT / "catalogue.yaml")
    args = parser.parse_args(argv)
    try:
        keep = search(args.model, args.calibration, args.margin, args.max_steps, args.catalogue)
    except BuildError as err:
        print(f"int8 search failed: {err}", file=sys.stderr)
        return 1
    print("\ncatalogue:\n      - onnx-int8:\n          keep_fp32:")
    for node in keep:
        print(f"            - {node}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
