"""`python -m benchmarks <verb> [options]`: every measuring tool, one command.

    python -m benchmarks                    # the verbs
    python -m benchmarks bench --help       # one verb's options

Each verb is a module with `main(argv) -> exit status`; this dispatcher imports only the one asked
for, and turns the errors (LauncherError: the launcher's; BenchmarkError: the verbs', TuneError among them) and
Ctrl-C into one line and an exit status.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import Optional

# verb -> (module with main(argv), what it measures)
VERBS = {
    "bench": ("benchmarks.bench.served", "one model served: capacity at its SLO, the in-process limit, "
                                         "p50/p99 alone and at low load; --stock, --ceiling, --full"),
    "bench-inprocess": ("benchmarks.bench.inprocess", "the handler's settings and variants against the naive "
                                                      "path, in-process, no server"),
    "generation": ("benchmarks.bench.generation", "a generating model: KV cache, continuous batching, TTFT, "
                                                  "modes, OpenAI, speculation, prefix cache, priorities"),
    "ray-generation": ("benchmarks.bench.ray_generation", "an LM on Ray Serve (1, 2 replicas) against TorchServe's async mode"),
    "engines": ("benchmarks.bench.engines", "TorchServe against Ray Serve (proxy, HAProxy): ready, idle memory, "
                                            "p50 at one client, capacity at the SLO; --generation: an LM"),
    "footprint": ("benchmarks.bench.footprint", "the whole server (make serve's models) on TorchServe and Ray "
                                                "Serve: ready, idle memory by process role, stop"),
    "device-check": ("benchmarks.bench.device_check", "every family on the CPU and CUDA in-process: agreement, "
                                                      "items/s, CUDA graphs, GPU memory"),
    "variants": ("benchmarks.bench.export_variants", "each variant of a model built alone: export and build "
                                                     "seconds, gate, size, time to ready, items/s"),
    "tune": ("benchmarks.tune.command", "batch size, delay, workers and variant per model (--mix: the whole "
                                        "server for a traffic mix); writes config.properties"),
    "tune-ray": ("benchmarks.tune.ray_plan", "the tune on Ray Serve: writes and verifies ray-serve.yaml (Serve's config)"),
    "reliability": ("benchmarks.reliability.suite", "bad input, faults, overload, deadlines, soak, security: "
                                                    "one table"),
    "soak": ("benchmarks.reliability.soak", "a long soak: RSS and p99 over time"),
    "deadlines": ("benchmarks.reliability.deadlines", "overload with and without request deadlines"),
    "overload": ("benchmarks.reliability.overload", "open-loop overload on a small job queue"),
    "bad-input": ("benchmarks.reliability.badinput", "the bad-input corpus against every model"),
    "faults": ("benchmarks.reliability.faults", "a worker SIGKILLed under load, broken archives"),
    "ray-node-loss": ("benchmarks.reliability.node_loss", "a Ray cluster node killed under load: 200/refused/lost, recovery"),
    "security": ("benchmarks.reliability.security", "token auth, limits, secrets"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:<{width}}  {what}" for verb, (_, what) in VERBS.items()]
    return "usage: python -m benchmarks <verb> [options]   (<verb> --help: its options)\n\nverbs:\n" + "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        close = difflib.get_close_matches(verb, VERBS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(f"python -m benchmarks: unknown verb {verb!r}: {hint}one of {', '.join(VERBS)}", file=sys.stderr)
        return 2
    from benchmarks.load.errors import BenchmarkError
    from build.errors import BuildError
    from serving.errors import LauncherError

    try:
        module = importlib.import_module(VERBS[verb][0])
    except ModuleNotFoundError as err:
        print(f"python -m benchmarks {verb}: not available here ({err})", file=sys.stderr)
        return 2
    try:
        return module.main(rest)
    except KeyboardInterrupt:
        print(f"\n{verb}: interrupted; every server was stopped", file=sys.stderr)
        return 130
    except (LauncherError, BenchmarkError, BuildError) as err:
        print(f"error [{verb}]: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
