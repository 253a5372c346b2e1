"""The benchmarks' one exception family: every wing raises these (the tuner's branch: tune/errors.py).

Its own root, not the launcher's: a verb's failure to measure is not a failure of serving/, and
`python -m benchmarks` names both apart (it catches LauncherError and BenchmarkError).
"""

from __future__ import annotations


class BenchmarkError(Exception):
    """A benchmark, tuning or reliability step could not run or measure (bad options, a load point
    where every request failed, an archive to test missing)."""
