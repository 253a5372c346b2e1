"""python -m deployment.kuberay: deploy/kuberay/ (RayService, its Serve config, the image's Dockerfile)
from Ray Serve's tuned config file, validated offline. `make deploy ENGINE=ray` calls this."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import yaml

from deployment.errors import DeployError
from deployment.kuberay import rayservice
from serving.ray import serve_config
from serving.repo import REPO_ROOT


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployment.kuberay", description=__doc__)
    p.add_argument("--serve-config", type=Path, default=REPO_ROOT / "ray-serve.yaml",
                   help="Ray Serve's config file (default: the repository's, written by make tune ENGINE=ray)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "deploy" / "kuberay", help="output folder")
    p.add_argument("--worker-memory-mib", type=int, default=rayservice.DEFAULT_WORKER_MEMORY_MIB,
                   help="memory per worker pod (one replica slot)")
    p.add_argument("--config", type=Path, default=REPO_ROOT / "config.properties",
                   help="the config.properties whose max_request_size and job_queue_size every app applies")
    p.add_argument("--check", action="store_true", help="only validate the folder's rayservice.yaml")
    args = p.parse_args(argv)
    try:
        if args.check:
            path = args.out / "rayservice.yaml"
            try:
                doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError) as exc:
                raise DeployError(f"{path}: cannot read it ({exc}); write it with  make deploy ENGINE=ray") from exc
            print(rayservice.validate(doc, str(path)))
            return 0
        size, files = rayservice.write(args.serve_config, args.out, args.worker_memory_mib,
                                       serve_config.configured_limits(args.config))
        print(f"[deploy] kuberay: {size.explain()}")
        for path in files:
            print(f"[deploy] wrote {path}")
        print(rayservice.validate(yaml.safe_load(files[0].read_text(encoding="utf-8")), str(files[0])))
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
