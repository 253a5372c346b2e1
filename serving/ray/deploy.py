"""Deploy a Serve config file onto a running cluster and wait until every app runs (a driver process).

    python -m serving.ray.deploy --address 127.0.0.1:<gcs port> --config serve.yaml --timeout 120

As `serve run <config> --non-blocking` does (Serve started with the file's HTTP options, the apps
submitted), then waits on Serve's own status: exit 0 once every app is RUNNING; exit 1 with the
failing app's message (a replica's traceback) when one fails or the time is up. The apps outlive
this process (Serve's controller is a detached actor).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

POLL_S = 0.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.ray.deploy", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the head's GCS address, host:port")
    parser.add_argument("--config", required=True, type=Path, help="Ray Serve's config file")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds until every app runs")
    args = parser.parse_args(argv)

    import ray
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ApplicationStatus, ServeDeploySchema

    config = ServeDeploySchema.model_validate(yaml.safe_load(args.config.read_text(encoding="utf-8")))
    from serving.ray.worker_setup import SETUP_HOOK

    # Serve's controller and proxies are actors of this job: they take its runtime_env's hook
    ray.init(address=args.address, namespace="serve", logging_level="warning", log_to_driver=False,
             runtime_env={"worker_process_setup_hook": SETUP_HOOK})
    client = serve_api.serve_start(http_options=config.http_options.model_dump(),
                                   proxy_location=config.proxy_location,
                                   grpc_options=gRPCOptions(**config.grpc_options.model_dump()))
    client.deploy_apps(config, _blocking=False)
    deadline = time.monotonic() + args.timeout
    names = [app.name for app in config.applications]
    while True:
        apps = serve.status().applications
        states = {name: apps.get(name) for name in names}
        failed = {n: a for n, a in states.items() if a is not None and a.status in
                  (ApplicationStatus.DEPLOY_FAILED, ApplicationStatus.UNHEALTHY)}
        if failed:
            for name, app in failed.items():
                print(f"app {name}: {app.status.value}: {app.message}", file=sys.stderr)
                for deployment, state in app.deployments.items():
                    if state.message:
                        print(f"deployment {deployment}: {state.status.value}: {state.message}", file=sys.stderr)
            return 1
        if all(a is not None and a.status == ApplicationStatus.RUNNING for a in states.values()):
            return 0
        if time.monotonic() > deadline:
            waiting = {n: (a.status.value if a else "not submitted") for n, a in states.items()}
            print(f"apps not running after {args.timeout:.0f} s: {waiting}", file=sys.stderr)
            return 1
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
