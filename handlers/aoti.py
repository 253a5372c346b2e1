"""AOTInductor archives: a `.pt2` package compiled at build time (build/aoti_export.py), loaded with
`torch._inductor.aoti_load_package`. The package holds the generated kernels and the frozen weights;
the worker needs no model source and no TorchScript runtime. It was compiled for the CPU that
built it (the archive says runtime.device: cpu): intra-op threads follow torch.set_num_threads."""

from __future__ import annotations

from pathlib import Path

import torch

from handlers.errors import ConfigError


def load_aoti(path: Path, device: torch.device):
    """The package's compiled model: called like the module it was exported from, on positional inputs."""
    if device.type != "cpu":
        raise ConfigError(f"{path.name}: an AOTInductor package compiled for the CPU cannot run on {device}: "
                          "serve it with runtime.device: cpu (the build writes it), or rebuild on the GPU host")
    try:
        return torch._inductor.aoti_load_package(str(path))
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"{path.name}: the AOTInductor package does not load here ({str(err).splitlines()[0][:200]}): "
                          "rebuild the archive with this host's torch (make build)") from None
