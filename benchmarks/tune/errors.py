"""The tuner's exceptions: a branch of the benchmarks' one family (`BenchmarkError` catches them all)."""

from __future__ import annotations

from benchmarks.load.errors import BenchmarkError


class TuneError(BenchmarkError):
    """The tuner cannot go on: bad options, no feasible candidate, a failed verification."""


class ConfigWriteError(TuneError):
    """config.properties was not written: the message says why (e.g. an archive overrides it)."""


class CheckpointError(TuneError):
    """A checkpoint to resume from is unreadable or belongs to another tuning run."""
