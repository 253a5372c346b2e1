"""What every `python -m benchmarks <verb>` shares: its options, declared once; its parser, whose
errors name the fix; its report folder; and its markdown tables.

A verb adds the shared options it takes by name (`add(parser, "model", "out", window_s={"default": 2.0})`)
and declares only its own with argparse; a shared option means the same thing under every verb.
"""

from __future__ import annotations

import argparse
import difflib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from serving.repo import DEFAULT_CONFIG, MODEL_STORE, REPO_ROOT, REPORTS

COMMAND = "python -m benchmarks"


@dataclass(frozen=True)
class Option:
    """One option as argparse takes it; a verb may change `default`, `help`, `required` or `action`."""

    flag: str
    help: str
    type: Optional[Callable[[str], Any]] = None
    default: Any = None
    choices: Optional[tuple] = None
    action: Optional[str] = None
    metavar: Optional[str] = None
    required: bool = False
    extra: dict = field(default_factory=dict)

    def kwargs(self) -> dict:
        out = {k: v for k, v in asdict(self).items()
               if k not in ("flag", "extra") and v is not None and not (k == "required" and v is False)}
        if self.action in ("store_true", "store_false"):
            out.pop("type", None)
        return {**out, **self.extra}


def numbers(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    """argparse type: comma-separated positive numbers of `kind`."""
    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
        return values
    return parse


OPTIONS: dict[str, Option] = {o.flag[2:].replace("-", "_"): o for o in (
    Option("--model", "a catalogue model (catalogue.yaml; default: the catalogue's first)"),
    Option("--out", "reports folder: the run writes its own folder under it", type=Path, default=REPORTS),
    Option("--config", "config.properties to read (the tuner: to write)", type=Path, default=DEFAULT_CONFIG),
    Option("--model-store", "the built archives", type=Path, default=MODEL_STORE),
    Option("--slo-ms", "p99 target in ms (default: the catalogue's slo_ms)", type=float),
    Option("--device", "where the workers run: cuda gives them one GPU (number_of_gpu=1), cpu keeps them off a GPU "
                       "the host has", default="cpu", choices=("cpu", "cuda")),
    Option("--budget-min", "time budget, minutes: a step that would not end within it is not started and the "
                           "report names it (0: none)", type=float),
    Option("--wait-quiet", "shared machines: before each step wait up to this long for no other TorchServe and an "
                           "idle CPU, and measure again a point other processes disturbed (default: don't)",
           type=float, default=0.0, metavar="SECONDS"),
    Option("--window-s", "open-loop measurement window, seconds", type=float),
    Option("--warmup-s", "unmeasured load after each server start, seconds", type=float),
    Option("--max-windows", "measured windows per point at most", type=int),
    Option("--stable-windows", "stable: this many last windows agree", type=int, default=3),
    Option("--stability-pct", "stable: the last windows' throughput and p99 within this %% of their mean",
           type=float),
    Option("--connections", "open loop: concurrent connections at most", type=int, default=64),
    Option("--point-requests", "open loop: arrivals per point at least, over its measured windows", type=int),
    Option("--max-points", "open-loop points per capacity search at most", type=int),
    Option("--min-gain-pct", "stop when the next step gains less, %%", type=float),
    Option("--seconds", "length of each run, seconds", type=float),
    Option("--factor", "offered load / measured capacity", type=float),
    Option("--job-queue-size", "the server's job_queue_size", type=int),
    Option("--batch-size", "TorchServe batchSize", type=int),
    Option("--workers", "minWorkers = maxWorkers", type=int),
    Option("--threads", "intra-op threads per worker (default: the archive's setting)", type=int),
    Option("--variant", "the catalogue variant to serve (build/variants.py)"),
    Option("--batch-sizes", "batch sizes, e.g. 1,8,64", type=numbers(int)),
)}


class Parser(argparse.ArgumentParser):
    """argparse whose refusals name the fix: the closest option and where the full list is."""

    def error(self, message: str):
        words = [w for w in message.replace(",", " ").split() if w.startswith("--")]
        known = [s for a in self._actions for s in a.option_strings]
        hints = []
        for word in words:
            close = difflib.get_close_matches(word.split("=")[0], known, n=1)
            if close:
                hints.append(f"did you mean {close[0]}?")
        hint = " ".join(hints + [f"see {self.prog} --help"])
        self.exit(2, f"{self.prog}: error: {message} ({hint})\n")


def parser(verb: str, description: str) -> Parser:
    return Parser(prog=f"{COMMAND} {verb}", description=description, allow_abbrev=False,
                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def add(target, *names: str, **changes: dict) -> None:
    """Add the shared options `names` (and those in `changes`, with their changed fields) to a parser
    or argument group."""
    for name in dict.fromkeys((*names, *changes)):
        if name not in OPTIONS:
            raise KeyError(f"no shared option {name!r}: declare it in benchmarks/load/cli.py's OPTIONS")
        option = OPTIONS[name]
        target.add_argument(option.flag, **{**option.kwargs(), **changes.get(name, {})})


def command_line(verb: str, argv: Sequence[str]) -> str:
    """The command as a user types it again (reports record it): a path inside the repository is
    written relative to it, so a committed report names no folder of the machine that ran it."""
    import shlex

    return shlex.join([".venv/bin/python", "-m", "benchmarks", verb, *map(_portable, argv)])


def _portable(arg: str) -> str:
    option, eq, value = arg.partition("=")
    if not (eq and arg.startswith("--")):
        option, eq, value = "", "", arg
    path = Path(value)
    if path.is_absolute() and path.is_relative_to(REPO_ROOT):
        value = str(path.relative_to(REPO_ROOT))
    return option + eq + value


def stamp() -> str:
    """The time a run's report folder is named after."""
    return time.strftime("%Y%m%d-%H%M%S")


def report_folder(out: Path, *parts: str, when: Optional[str] = None) -> Path:
    """A new run's report folder: out/<part>-<part>-<YYYYmmdd-HHMMSS> (`when`: that stamp, default now)."""
    return Path(out) / "-".join([*parts, when or stamp()])


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: Sequence[str] = ()) -> list[str]:
    """A markdown table's lines; a cell of None is empty; `align`: a column's rule ("---:" to the right)."""
    def line(cells) -> str:
        return "|" + "|".join(f" {c} " if c not in (None, "") else " " for c in cells) + "|"

    rules = [align[i] if i < len(align) else "---" for i in range(len(header))]
    return [line(header), "|" + "".join(f"{r}|" for r in rules), *map(line, rows)]


def progress(tag: str = "") -> Callable[[str], None]:
    """A progress printer to stderr: time, then `[tag]` when given."""
    import sys

    prefix = f"[{tag}] " if tag else ""

    def say(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {prefix}{line}", file=sys.stderr, flush=True)
    return say


def model_or_first(model: Optional[str]) -> str:
    """--model, or the catalogue's first model when none was given."""
    from build.catalogue import Catalogue
    from serving.repo import CATALOGUE

    return model or Catalogue.load(CATALOGUE).names[0]


class Checked:
    """A check's result: `problems` (what failed, one line each) and `passed` when there are none."""

    problems: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.problems


def verdict(*results: Any, report: Optional[Path] = None) -> int:
    """Print each result's summary and problems (objects with summary(), problems, passed); 0 when all passed."""
    for result in results:
        print(result.summary())
        for problem in result.problems:
            print(f"  FAIL {problem}")
    if report is not None:
        print(f"report: {report}")
    return 0 if all(r.passed for r in results) else 1


@contextmanager
def figure(path: Path, *args: Any, dpi: int = 110, **kwargs: Any) -> Iterator[Any]:
    """A report's PNG: yields the axes of `plt.subplots(*args, **kwargs)` (matplotlib's Agg backend)
    and saves the figure to `path` when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


ENGINES = ("torchserve", "ray")
ENGINE_NAMES = MappingProxyType({"torchserve": "TorchServe", "ray": "Ray Serve (HAProxy)"})


def engines(text: str) -> tuple[str, ...]:
    """argparse type of --engine: engines, comma-separated."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in ENGINES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: name one or more of {', '.join(ENGINES)}")
    return names
