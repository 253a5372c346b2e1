"""Read and write Java `.properties` files (the format of TorchServe's config.properties).

The reader lives in handlers/properties.py (a worker reads its thread plan with it); this adds the writer.
"""

from __future__ import annotations

from handlers.properties import parse, read

__all__ = ["parse", "read", "format_properties"]


def _escape(text: str, is_key: bool) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    if is_key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    elif out.startswith(" "):
        out = "\\" + out
    return out


def format_properties(props: dict[str, str], header: str = "") -> str:
    """One `key=value` line per entry (values on a single line), with `header` as comments."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"{_escape(k, True)}={_escape(v, False)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"
