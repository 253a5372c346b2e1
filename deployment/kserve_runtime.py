"""Our KServe ServingRuntime: TorchServe in our image, started the way the image starts it, over the
model-root/ that KServe mounts at /mnt/models. The InferenceService names it (`runtime:`), so the
deployment does not depend on any runtime bundled with KServe (kserve-torchserve included).

A namespaced ServingRuntime, not a ClusterServingRuntime: it holds this deployment's image and
config paths, so it belongs beside its InferenceService, applies with namespace rights alone, and
no other namespace's InferenceService can land on it. Its model format is our own name with
autoSelect off: only an InferenceService that names the runtime gets it.
"""

from __future__ import annotations

from typing import Any

from deployment import k8s
from deployment.image import INIT, torchserve_argv
from deployment.layout import KSERVE, PROBE

NAME = f"{k8s.NAME}-runtime"
API_VERSION = "serving.kserve.io/v1alpha1"
KIND = "ServingRuntime"
# model-root/: TorchServe archives plus their config.properties, not a bare PyTorch file.
MODEL_FORMAT = "torchserve-mar"
# TorchServe routes both to our handler (handlers/kserve.py); gRPC would need a second port, and
# Knative allows one.
PROTOCOLS = ("v1", "v2")
# KServe merges the InferenceService's model fields (resources, storage) into the container of this name.
CONTAINER = "kserve-container"
# KServe sends traffic to the first port (raw mode: Service port 80 -> this one; Knative: the only
# one allowed, named http1 for HTTP/1.1; h2c would mean gRPC).
PORT_NAME = "http1"


def container_argv() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(command, args): the image's init, then the image's own TorchServe argv with the KServe
    layout's paths (foreground, our config named, --ncs)."""
    return INIT, torchserve_argv(KSERVE)


def serving_runtime() -> dict[str, Any]:
    command, args = container_argv()
    port = KSERVE.ports.inference
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": NAME, "labels": dict(k8s.LABELS)},
        "spec": {
            # Copied onto the predictor pods: where the Prometheus scraper finds TorchServe's metrics.
            "annotations": {"prometheus.kserve.io/port": str(KSERVE.ports.metrics), "prometheus.kserve.io/path": "/metrics"},
            "supportedModelFormats": [{"name": MODEL_FORMAT, "autoSelect": False}],
            "protocolVersions": list(PROTOCOLS),
            "multiModel": False,
            "containers": [{
                "name": CONTAINER,
                "image": k8s.IMAGE_REF,
                "command": list(command),
                "args": list(args),
                "env": [{"name": "TS_CONFIG_FILE", "value": KSERVE.config}],
                "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
                # /ping needs the pod's key (token auth): probe.py reads it; ready once every model has
                # its READY workers, so no request reaches a model still loading.
                "readinessProbe": {"exec": {"command": ["python", PROBE, str(port)]}, "periodSeconds": 10,
                                   "timeoutSeconds": 5, "failureThreshold": 3},
                "securityContext": k8s.security_context(),
            }],
        },
    }
