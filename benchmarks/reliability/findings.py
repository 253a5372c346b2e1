"""What `make reliability` found: every check's result, the totals, and the one table it prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from benchmarks.load import cli, stats
from benchmarks.load.traffic import Traffic
from benchmarks.reliability import badinput, deadlines, faults, overload, security, soak


@dataclass(frozen=True)
class Row:
    measure: str
    value: str
    passed: Optional[bool]  # None: for information


@dataclass(frozen=True)
class Findings(cli.Checked):
    corpus: Optional[badinput.CorpusResult] = None
    kill: Optional[faults.KillResult] = None
    archives: Optional[faults.BrokenArchivesResult] = None
    overload: Optional[overload.OverloadResult] = None
    soak: Optional[soak.SoakResult] = None
    deadline_overload: Optional[deadlines.DeadlineComparison] = None
    checks: tuple[security.Check, ...] = ()
    errors: tuple[str, ...] = ()  # checks that could not run at all

    def rows(self) -> list[Row]:
        rows = []
        c = self.corpus
        if c is not None:
            invalid = sum(1 for o in c.outcomes if not o.case.valid)
            rows += [Row("inputs tried", str(c.tried), c.passed),
                     Row("rejected correctly (4xx + message)", f"{c.rejected_correctly}/{invalid}", c.passed),
                     Row("accepted correctly (200)", f"{c.accepted_correctly}/{c.tried - invalid}", c.passed),
                     Row("batch-mates of invalid inputs answered 200",
                         f"{sum(o.correct for o in c.batchmates)}/{len(c.batchmates)}", c.passed)]
        injected = ([self.kill] if self.kill else []) + (list(self.archives.failures) if self.archives else [])
        if injected:
            survived = (1 if self.kill and self.kill.passed else 0) + sum(
                1 for f in (self.archives.failures if self.archives else ()) if not f.problems)
            ok = (not self.kill or self.kill.passed) and (not self.archives or self.archives.passed)
            rows.append(Row("faults injected / survived", f"{len(injected)} / {survived}", ok))
        if self.kill and self.kill.recovery_s is not None:
            rows.append(Row("worker recovery after SIGKILL (kill -> READY)", f"{self.kill.recovery_s:.1f} s",
                            self.kill.passed))
        traffic = self.traffic()
        rows.append(Row("requests sent / answered / lost", f"{traffic.sent} / {traffic.answered} / {traffic.lost}",
                        traffic.lost == 0))
        if self.overload:
            o = self.overload
            rows += [Row("overload 503s (queue full)", f"{o.rejected_503} of {o.traffic.sent}", o.passed),
                     Row("overload accepted latency (p99 bound)", f"{o.accepted_tail} ({o.p99_bound_ms:.0f} ms)",
                         o.passed)]
        if self.deadline_overload:
            d = self.deadline_overload
            without, with_ = d.runs
            rows += [Row(f"2x overload, answered within {d.budget_ms} ms (no deadline -> deadline)",
                         f"{without.in_time_share:.0%} -> {with_.in_time_share:.0%}", d.passed),
                     Row("2x overload, tail of the 200s (no deadline -> deadline)",
                         f"{stats.tail_text(without.answered, 0)} -> {stats.tail_text(with_.answered, 0)}", d.passed)]
        if self.soak:
            s = self.soak
            rows += [Row("soak requests ok", f"{s.traffic.ok}/{s.traffic.sent} in {s.minutes:g} min", s.passed),
                     Row("soak RSS growth (frontend, workers)",
                         f"{s.growth_text('frontend')}, {s.growth_text('workers')}", s.passed)]
        noise = [(name, r.others_cpu_pct) for name, r in (("kill", self.kill), ("overload", self.overload),
                                                          ("soak", self.soak)) if r is not None]
        if noise:
            rows.append(Row("CPU used by other processes (% of a core)",
                            ", ".join(f"{name} {pct:.0f}%" for name, pct in noise), None))
        if self.checks:
            rows.append(Row("security checks passed", f"{sum(c.passed for c in self.checks)}/{len(self.checks)}",
                            all(c.passed for c in self.checks)))
        rows += [Row("could not run", error[:90], False) for error in self.errors]
        return rows

    def traffic(self) -> Traffic:
        total = Traffic()
        for result in (self.corpus, self.kill, self.archives, self.overload, self.soak, self.deadline_overload):
            if result is not None:
                total = total + result.traffic
        return total

    @property
    def problems(self) -> tuple[str, ...]:
        out = [p for r in (self.corpus, self.kill, self.archives, self.overload, self.soak, self.deadline_overload)
               if r for p in r.problems]
        return tuple(out) + tuple(c.line() for c in self.checks if not c.passed) + self.errors


def table(rows: Sequence[Row]) -> str:
    width = max(len(r.measure) for r in rows)
    vwidth = max(len(r.value) for r in rows)
    lines = [f"{'measure':<{width}}  {'value':<{vwidth}}  verdict", "-" * (width + vwidth + 11)]
    verdicts = {True: "ok", False: "FAIL", None: "info"}
    lines += [f"{r.measure:<{width}}  {r.value:<{vwidth}}  {verdicts[r.passed]}" for r in rows]
    return "\n".join(lines)
