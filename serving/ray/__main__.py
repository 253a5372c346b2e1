"""`python -m serving.ray start|stop`: what `make serve ENGINE=ray` and `make stop` run.

start: a Ray cluster on this host (serving/ray/launcher.py) serving the archives config.properties
loads (`load_models`, with its `models=` settings where it has them, else each archive's own), on
free loopback ports with TorchServe's key file; waits until ready, prints the URL, the key file and a
working request per model, records the cluster in logs/ray-serve.json and returns (the cluster runs on).
stop: ends every process of the recorded cluster (nodes, workers, proxies, HAProxy) and removes its
folder; nothing recorded: nothing to do.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from serving.errors import ConfigError, LauncherError, StartupError
from serving.ray import serve_config
from serving.ray.ending import stop_detached
from serving.ray.launcher import RayServe
from serving.repo import DEFAULT_CONFIG, MODEL_STORE, REPO_ROOT
from serving.ts_config import ServerConfig

STATE = REPO_ROOT / "logs" / "ray-serve.json"


def start(config_path: Path, haproxy: bool) -> int:
    if STATE.is_file():
        print(f"a Ray cluster of ours is already recorded in {STATE}: make stop first", file=sys.stderr)
        return 1
    config = ServerConfig.load(config_path)
    archives = config.startup_archives(MODEL_STORE)
    for name, archive in archives.items():
        if Path(archive).name != f"{name}.mar":
            raise ConfigError(f"load_models: {name}={Path(archive).name}: on Ray a model is served from "
                              f"{name}.mar (rename the archive or the model)")
    settings = {entry.name: entry.settings for entry in config.models if entry.name in archives}
    limits = serve_config.configured_limits(config_path)
    cluster = RayServe(MODEL_STORE, models=tuple(archives), settings=settings, haproxy=haproxy,
                       max_request_size=limits.max_request_size, job_queue_size=limits.job_queue_size)
    cluster.start()
    state = {**cluster.detach(), "ready_s": round(cluster.started_s or 0.0, 1)}
    STATE.parent.mkdir(exist_ok=True)
    STATE.write_text(json.dumps(state, indent=2), encoding="utf-8")
    url, key_file = state["url"], state["key_file"]
    print(f"Ray Serve ready in {state['ready_s']} s at {url} (inference key in {key_file}; make stop ends it)")
    print(f"  Open Inference Protocol v2: {url}/v2 (tritonclient: url={url.split('//', 1)[1]}); "
          f"Prometheus: {state['metrics']}/metrics")
    key = f"$(python3 -c 'import json; print(json.load(open({str(key_file)!r}))[\"inference\"][\"key\"])')"
    for model in state["models"]:
        print(f"  curl -H \"Authorization: Bearer {key}\" -H 'Content-Type: application/json' "
              f"--data-binary @<request> {shlex.quote(f'{url}/predictions/{model}')}")
    return 0


def stop() -> int:
    if not STATE.is_file():
        return 0
    stop_detached(json.loads(STATE.read_text(encoding="utf-8")))
    STATE.unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.ray", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the config.properties to serve")
    parser.add_argument("--proxy", dest="haproxy", action="store_false",
                        help="Serve's Python proxy instead of its HAProxy ingress (the default)")
    args = parser.parse_args(argv)
    try:
        return start(args.config, args.haproxy) if args.action == "start" else stop()
    except (ConfigError, LauncherError, StartupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
