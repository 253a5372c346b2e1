"""Model families: what serving needs to know of a model's inputs and outputs (base.py), one module
per family, registered in registry.py (`family_class(name)`, FAMILIES).

This package's own module imports no family: a family module importing its siblings
(handlers.families.cases, ...) never meets a half-initialised package. `Family`, `FAMILIES` and
`family_class` are still importable from here; they load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAMILIES", "Family", "family_class"]


def __getattr__(name: str) -> Any:
    if name == "Family":
        from handlers.families.base import Family

        return Family
    if name in ("FAMILIES", "family_class"):
        from handlers.families import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'handlers.families' has no attribute {name!r}")
