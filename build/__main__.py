"""`python -m build`: turn the catalogue into model_store/<name>.mar, incrementally.

A broken entry fails with a message naming the model and the problem; the other archives are
still built and the exit status says something failed. `--model` builds some entries (every
variant); `--for-config config.properties` only the archives its load_models names (make serve:
build/selection.py).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from build.archive import build_entry
from build.catalogue import Catalogue
from build.errors import BuildError
from build.report import lines as report_lines
from build.report import write as write_report
from build.selection import Selection, check_examples, for_config
from build.speed import SECONDS

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build", description=__doc__.splitlines()[0])
    parser.add_argument("--catalogue", type=Path, default=ROOT / "catalogue.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "model_store", help="model store folder")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--model", action="append", help="build only this model, every variant (repeatable)")
    only.add_argument("--for-config", type=Path, metavar="CONFIG",
                      help="build only the archives this config.properties' load_models names (make serve)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the inputs are unchanged")
    parser.add_argument("--speed-seconds", type=float, default=SECONDS,
                        help="seconds each variant's report speed is timed per batch size (default %(default)s)")
    args = parser.parse_args(argv)

    try:
        catalogue = Catalogue.load(args.catalogue)
        names = args.model or list(catalogue.names)
        unknown = [name for name in names if name not in catalogue.names]
        if unknown:
            raise BuildError(f"no model {unknown[0]!r} in {args.catalogue} (known: {', '.join(catalogue.names)})")
        variants = {}  # model -> the variants to build; a model not here: all of them
        if args.for_config is not None:
            selection = for_config(catalogue, args.for_config)
            check_foreign(selection, args.for_config, args.out)
            check_examples(catalogue, selection, args.catalogue.resolve().parent)
            names, variants = list(selection.names), dict(selection.variants)
    except BuildError as err:
        print(f"build failed: {err}", file=sys.stderr)
        return 1

    failed, built = [], []
    for i, name in enumerate(names, 1):
        asked = variants.get(name)
        print(f"[{i}/{len(names)}] {name}" + (f" (variants: {', '.join(asked)})" if asked else ""), flush=True)
        try:
            # Paths in a catalogue are relative to its folder (the repository's, for catalogue.yaml).
            result = build_entry(catalogue, name, args.catalogue.resolve().parent, args.out, force=args.force,
                                 progress=lambda msg: print(msg, flush=True), only=asked,
                                 speed_seconds=args.speed_seconds)
        except BuildError as err:
            print(f"  FAILED {name}: {err}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        except Exception as err:  # noqa: BLE001 - whatever a user's module raises fails its entry alone
            print(f"  FAILED {name}: unexpected {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            traceback.print_exc(file=sys.stderr)
            failed.append(name)
            continue
        built.append(result)
        if result.rebuilt:
            print(f"  built {', '.join(p.name for p in result.archives.values())} in {result.seconds:.1f}s", flush=True)
        else:
            print(f"  {', '.join(p.name for p in result.archives.values())}: up to date (inputs unchanged)", flush=True)
    if built:
        report = write_report(args.out, built)
        print(f"\nvariants (accuracy gate vs fp32 eager; in-process items/s on 1 thread, batch 1 / 8): {report}")
        for result in built:
            for line in report_lines(result):
                print("  " + line.strip("| ").replace(" | ", "  "), flush=True)
    if failed:
        print(f"build failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def check_foreign(selection: Selection, config: Path, store: Path) -> None:
    """An archive no catalogue entry builds is served as the store has it; it must be there."""
    for archive in selection.foreign:
        if not (store / archive).is_file():
            raise BuildError(f"{config.name} load_models names {archive}, which no entry of the catalogue builds and "
                             f"{store} does not hold: add its entry to the catalogue, put the archive in the store, "
                             "or drop it from load_models")
        print(f"note: {archive} is not built from the catalogue: served as {store.name}/ holds it", flush=True)


if __name__ == "__main__":
    sys.exit(main())
