"""Where the repository's files are, and how reports name them.

Reports are committed and read on other machines: a path inside the repository is written
relative to it (`config.properties`, `benchmarks/reports/...`), never with this machine's prefix.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = REPO_ROOT / "catalogue.yaml"
MODEL_STORE = REPO_ROOT / "model_store"
DEFAULT_CONFIG = REPO_ROOT / "config.properties"
REPORTS = REPO_ROOT / "benchmarks" / "reports"


def shown(path: str | Path) -> str:
    """`path` relative to the repository when it lies inside it, else as given (absolute)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(resolved)
