"""wrk2 (github.com/giltene/wrk2), the third-party constant-rate client the benchmark's open-loop
figures are checked against: run it against one model and read its corrected latency histogram.

wrk2 is not a dependency of the project: it is built from its public source by whoever measures
(docs/benchmarks.md) and found as `--wrk`, $WRK2 or `wrk` on PATH. Its first 10 s (plus 5 ms per
connection of a thread) are a calibration whose samples it discards: `run` adds them to the asked
duration, so `seconds` is what is measured.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.load.loadgen import Payload, Target
from serving.errors import BenchmarkError

CALIBRATION_S = 10.0
_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_PERCENTILE = re.compile(r"^\s*(\d+\.\d+)%\s+([\d.]+)(us|ms|s|m|h)\s*$")
_TOTAL = re.compile(r"#\[Max\s*=\s*[\d.]+,\s*Total count\s*=\s*(\d+)\]")
_RATE = re.compile(r"^Requests/sec:\s*([\d.]+)", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")


@dataclass(frozen=True)
class Wrk2Run:
    """One wrk2 run's measured part: its corrected latencies (from each request's scheduled time)."""

    rate_rps: float
    connections: int
    threads: int
    seconds: float
    requests: int  # samples in the histogram (after calibration)
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int  # non-2xx answers and socket errors (over the whole run, calibration included)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def executable(given: Optional[str] = None) -> Path:
    """wrk2's binary: `given`, else $WRK2, else `wrk` on PATH (it must be wrk2: it takes -R)."""
    found = given or os.environ.get("WRK2") or shutil.which("wrk")
    if not found or not Path(found).is_file():
        raise BenchmarkError("wrk2 not found: build it from github.com/giltene/wrk2 (make) and pass --wrk PATH "
                             "or set WRK2=PATH")
    return Path(found)


def script(folder: Path, target: Target, payloads: Sequence[Payload]) -> Path:
    """A Lua script that sends `payloads` in turn to the target's model, with its key."""
    entries = []
    for index, payload in enumerate(payloads):
        body = folder / f"body-{index}"
        body.write_bytes(payload.body)
        entries.append(f'{{path = "{body}", type = "{payload.content_type}", url = "{payload.path or target.path}"}}')
    lua = folder / "post.lua"
    lua.write_text(
        "local items = {" + ", ".join(entries) + "}\n"
        "local requests = {}\n"
        "for i, item in ipairs(items) do\n"
        '  local f = assert(io.open(item.path, "rb"))\n'
        '  local body = f:read("*a")\n'
        "  f:close()\n"
        '  requests[i] = wrk.format("POST", item.url, {["Content-Type"] = item.type, '
        f'["Authorization"] = "Bearer {target.token}"}}, body)\n'
        "end\n"
        "local k = 0\n"
        "request = function()\n"
        "  k = k % #requests + 1\n"
        "  return requests[k]\n"
        "end\n",
        encoding="utf-8",
    )
    lua.chmod(0o600)  # it holds the inference key
    return lua


def parse(text: str, rate_rps: float, connections: int, threads: int, seconds: float) -> Wrk2Run:
    """The figures of wrk2's `--latency` output (its corrected, 'Recorded Latency' histogram)."""
    marker = text.find("Latency Distribution (HdrHistogram - Recorded Latency)")
    if marker < 0:
        raise BenchmarkError(f"wrk2 printed no latency distribution (was --latency given?):\n{text[-2000:]}")
    percentiles: dict[float, float] = {}
    for line in text[marker:].splitlines()[1:]:
        match = _PERCENTILE.match(line)
        if match is None:
            if percentiles:
                break
            continue
        percentiles[float(match[1])] = float(match[2]) * _UNITS_MS[match[3]]
    total, rate = _TOTAL.search(text), _RATE.search(text)
    missing = [q for q in (50.0, 90.0, 99.0) if q not in percentiles]
    if missing or total is None or rate is None:
        raise BenchmarkError(f"wrk2's output lacks {missing or 'its total count or rate'}:\n{text[-2000:]}")
    non_2xx = _NON_2XX.search(text)
    socket = _SOCKET.search(text)
    errors = (int(non_2xx[1]) if non_2xx else 0) + (sum(int(g) for g in socket.groups()) if socket else 0)
    return Wrk2Run(rate_rps, connections, threads, seconds, int(total[1]), float(rate[1]),
                   percentiles[50.0], percentiles[90.0], percentiles[99.0], errors)


def run(wrk: Path, lua: Path, target: Target, rate_rps: float, connections: int, threads: int,
        seconds: float, keep: Optional[Path] = None, timeout_s: float = 60.0) -> Wrk2Run:
    """wrk2 at a constant `rate_rps` over `connections` for `seconds` measured; `keep`: a file for
    its output as printed."""
    threads = max(1, min(threads, connections))
    duration = seconds + CALIBRATION_S + 0.005 * connections / threads + 1
    argv = [str(wrk), f"-t{threads}", f"-c{connections}", f"-d{duration:.0f}s", f"-R{rate_rps:g}", "--latency",
            f"--timeout={timeout_s:g}s", "-s", str(lua), f"http://{target.host}:{target.port}{target.path}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + timeout_s + 30, check=False)
    if keep is not None:
        # As typed, with the binary and the script by name: no path of the machine that ran it.
        typed = ["wrk", *argv[1:-3], "-s", "post.lua", argv[-1]]
        keep.write_text(" ".join(typed) + "\n" + done.stdout, encoding="utf-8")
    if done.returncode != 0:
        raise BenchmarkError(f"wrk2 exited {done.returncode}: {done.stderr[-2000:] or done.stdout[-2000:]}")
    return parse(done.stdout, rate_rps, connections, threads, seconds)
