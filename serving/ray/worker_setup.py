"""What every Ray worker process of ours runs before its actor (Ray's `worker_process_setup_hook`):
pandas and pyarrow are left out.

Serve imports pandas whenever it is installed (to encode DataFrames as JSON) and Ray's serialiser
imports pyarrow (for Ray Data's blocks); nothing served here passes either, yet they load in every
replica, controller and proxy. Both are in this environment for the build's and the benchmarks'
sake (statsmodels, datasets). Marking them absent makes those optional imports take their
"not installed" branch. A handler that does need pandas gets a clear ModuleNotFoundError at its
import: take pandas out of LEFT_OUT. On a cluster the launcher starts, the deploying driver's job
carries this hook to every Serve process, replicas included, whatever an app's runtime_env names."""

from __future__ import annotations

import sys

LEFT_OUT = ("pandas", "pyarrow")
SETUP_HOOK = "serving.ray.worker_setup.setup"  # Ray imports it by this dotted name in each worker


def setup() -> None:
    for name in LEFT_OUT:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: Python's "not installed" marker
