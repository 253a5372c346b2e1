"""Where things live inside the image and under KServe, and the ports: one place, so the
Dockerfile, the manifests, the image's config.properties and the e2e test agree."""

from __future__ import annotations

from dataclasses import dataclass

# The container's home and working directory: TorchServe writes key_file.json, logs/ and its
# tmp files into its working directory, so the non-root user must own it.
HOME = "/home/model-server"
USER = "model-server"
UID = 1000


@dataclass(frozen=True)
class Ports:
    inference: int
    management: int
    metrics: int
    grpc_inference: int = 7070
    grpc_management: int = 7071


@dataclass(frozen=True)
class Layout:
    """One way of running TorchServe: its files' paths and its ports."""

    root: str  # prefix the e2e test rewrites to a temp folder
    config: str
    model_store: str
    log4j: str
    ports: Ports


# The image: everything baked under HOME.
IMAGE = Layout(root=HOME, config=f"{HOME}/config.properties", model_store=f"{HOME}/model-store",
               log4j=f"{HOME}/log4j2.xml", ports=Ports(8080, 8081, 8082))
# KServe mounts the storageUri at /mnt/models; our ServingRuntime (deployment/kserve_runtime.py) reads
# these paths and declares 8085 as its traffic port. Management stays on its own port: KServe never calls it.
KSERVE = Layout(root="/mnt/models", config="/mnt/models/config/config.properties",
                model_store="/mnt/models/model-store", log4j="/mnt/models/config/log4j2.xml",
                ports=Ports(8085, 8081, 8082))

PROBE = f"{HOME}/probe.py"
KEY_FILE = f"{HOME}/key_file.json"
APP = "torchserve"
