"""The benchmarks' one exception family: every wing raises these (the tuner's branch: tune/errors.py).

A BenchmarkError is a LauncherError (serving/errors.py), so one handler catches the launcher's errors
and these (`python -m benchmarks` does).
"""

from __future__ import annotations

from serving import errors


# The base in serving/errors.py stays only while a module outside this wing's owners still names it.
class BenchmarkError(errors.BenchmarkError):
    """A benchmark, tuning or reliability step could not run or measure (bad options, a load point
    where every request failed, an archive to test missing)."""
