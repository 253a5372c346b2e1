"""What a report must say about where it was measured."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from serving.repo import REPO_ROOT


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe_environment() -> dict:
    import psutil
    import torch

    from handlers import runtime

    try:
        from ts.version import __version__ as torchserve_version
    except ImportError:
        torchserve_version = "not installed"
    return {
        "cpu": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchserve": torchserve_version,
        "bf16_cpu": runtime.cpu_supports(torch.bfloat16),  # native (AVX-512 BF16 or AMX), not oneDNN's conversion
        "git_commit": git_commit(),
    }
