"""A vendored CustomResourceDefinition's schema, made strict: offline, what the API server's strict
field validation (`kubectl apply --validate=strict`) would refuse in one of our custom resources.

The CRDs under deployment/crds/ are KServe's own files, verbatim. Their object schemas list their
fields without `additionalProperties`: the API server prunes unknown fields there, and strict field
validation turns that pruning into an error. Here every such object gets `additionalProperties:
false` (unless it says `x-kubernetes-preserve-unknown-fields`), so a misspelt field fails.
`metadata` is a bare `type: object` in every CRD (the API server checks ObjectMeta itself): it gets
the ObjectMeta fields our manifests set, with Kubernetes' name rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from deployment.errors import DeployError

CRDS = Path(__file__).with_name("crds")
# ObjectMeta as far as a generated manifest uses it; a DNS-1123 subdomain name (RFC 1123, 253 chars).
OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 253,
                 "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


@dataclass(frozen=True)
class CrdSchema:
    """One version of one vendored CRD: its kind, apiVersion and strict JSON schema."""

    source: str  # file name under deployment/crds/
    kind: str
    api_version: str
    schema: dict[str, Any]


def strict(node: Any) -> Any:
    """A copy of an OpenAPI v3 schema in which objects with listed fields accept no others."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def load(filename: str, version: str) -> CrdSchema:
    """The strict schema of `version` in deployment/crds/<filename> (read once per process)."""
    path = CRDS / filename
    try:
        crd = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        spec = crd["spec"]
        (served,) = [v for v in spec["versions"] if v["name"] == version]
        schema = strict(served["schema"]["openAPIV3Schema"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise DeployError(f"{path}: not a CRD with version {version} ({exc}); re-vendor it from KServe") from exc
    api_version = f"{spec['group']}/{version}"
    kind = spec["names"]["kind"]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
    schema["properties"].update(apiVersion={"const": api_version}, kind={"const": kind}, metadata=OBJECT_META)
    return CrdSchema(source=filename, kind=kind, api_version=api_version, schema=schema)
