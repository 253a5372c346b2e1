"""deploy/ as it would run: TorchServe started with the image's ENTRYPOINT argv and with the args of
our KServe ServingRuntime's container over the exported model-root/, both from freshly generated
files, serving /predictions/<m> for every model of the mix plus KServe v1 and Open Inference
Protocol v2 calls."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from deployment import __main__ as cli
from deployment.image import INIT
from deployment.layout import HOME, KSERVE
from deployment.plan import PlanOptions
from serving.client import Tokens
from tests.e2e.entrypoint_server import (
    EntrypointServer,
    remove,
    rewrite_config,
    temp_root,
)
from tests.mix_config import mix_record, write_mix_config

pytestmark = pytest.mark.e2e
TEXT = "A man is eating food."


@pytest.fixture(scope="module")
def deploy_dir(model_store: Path, repo_root: Path, tmp_path_factory) -> Path:
    """deploy/ generated from the repository's config.properties with a mix record added."""
    base = tmp_path_factory.mktemp("deploy")
    config = write_mix_config(repo_root / "config.properties", base / "config.properties", mix_record())
    out = base / "deploy"
    cli.generate(repo_root, config, out, PlanOptions())
    return out


def dockerfile_entry(dockerfile: Path) -> tuple[list[str], dict[str, str]]:
    """ENTRYPOINT (without the init process) and ENV TS_CONFIG_FILE, as the image has them."""
    argv, env = None, {}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            argv = json.loads(line[len("ENTRYPOINT "):])
        elif line.startswith("ENV TS_CONFIG_FILE="):
            env["TS_CONFIG_FILE"] = line.partition("=")[2]
    assert argv is not None and argv[: len(INIT)] == list(INIT), "ENTRYPOINT must start with the init process"
    return argv[len(INIT):], env


def check_serving(server: EntrypointServer, cat_png: Path) -> None:
    client, tokens = server.client, server.client.tokens
    base = client.endpoints.inference
    # Why the probes are exec probes: /ping without the key is refused.
    assert requests.get(f"{base}/ping", timeout=10).status_code == 400
    assert client.ping().status_code == 200
    answer = client.predict("minilm", {"text": TEXT})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["embedding"]) == 384
    answer = client.predict("efficientnet_lite0", cat_png.read_bytes(), "image/png")
    assert answer.status_code == 200, answer.text
    assert answer.json()
    headers = {**Tokens.header(tokens.inference), "Content-Type": "application/json"}
    v1 = requests.post(f"{base}/v1/models/minilm:predict", headers=headers, timeout=60,
                       data=json.dumps({"instances": [{"text": TEXT}]}))
    assert v1.status_code == 200 and "predictions" in v1.json(), f"KServe v1: {v1.status_code} {v1.text[:300]}"
    v2 = requests.post(f"{base}/v2/models/minilm/infer", headers=headers, timeout=60, data=json.dumps(
        {"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [TEXT]}]}))
    assert v2.status_code == 200 and "outputs" in v2.json(), f"OIP v2: {v2.status_code} {v2.text[:300]}"


def test_image_entrypoint(deploy_dir: Path, model_store: Path, cat_png: Path) -> None:
    argv, env = dockerfile_entry(deploy_dir / "Dockerfile")
    root = temp_root("deploy-image-")
    try:
        # What the Dockerfile COPYs, at the same places under root.
        store = root / "model-store"
        store.mkdir()
        for name in mix_record().shares:
            (store / f"{name}.mar").symlink_to(model_store / f"{name}.mar")
        shutil.copy(Path(__file__).resolve().parents[2] / "log4j2.xml", root / "log4j2.xml")
        probe = (deploy_dir / "image/probe.py").read_text().replace(HOME, str(root))
        (root / "probe.py").write_text(probe)
        config = rewrite_config(deploy_dir / "image/config.properties", root / "config.properties", HOME, root)
        argv = [a.replace(HOME, str(root)) for a in argv]
        env = {k: v.replace(HOME, str(root)) for k, v in env.items()}
        assert argv[:2] == ["torchserve", "--foreground"] and argv[-1] == "--ncs"
        with EntrypointServer(argv, root, config, env, models=tuple(mix_record().shares)) as server:
            port = config.address("inference_address").rsplit(":", 1)[1]
            probe_run = subprocess.run([sys.executable, str(root / "probe.py"), port], capture_output=True,
                                       text=True, timeout=30, check=False)
            assert probe_run.returncode == 0, probe_run.stderr
            check_serving(server, cat_png)
    finally:
        remove(root)


def test_kserve_layout(deploy_dir: Path, cat_png: Path) -> None:
    """TorchServe started with exactly the container args our ServingRuntime holds, over a copy of
    model-root/ where KServe would mount it (/mnt/models moved to a temp folder)."""
    isvc = yaml.safe_load((deploy_dir / "kserve/inferenceservice.yaml").read_text())
    runtime = yaml.safe_load((deploy_dir / "kserve/servingruntime.yaml").read_text())
    assert isvc["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    (container,) = [c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container"]
    # command is the image's init (tini), as in the Dockerfile; the args are the server's argv.
    assert container["command"] == list(INIT)
    root = temp_root("deploy-kserve-")
    try:
        # KServe mounts the uploaded model-root/ at /mnt/models.
        shutil.copytree(deploy_dir / "kserve/model-root", root, dirs_exist_ok=True, copy_function=os.link)
        config_path = root / "config" / "config.properties"
        source = config_path.with_suffix(".source")
        config_path.rename(source)
        config = rewrite_config(source, config_path, KSERVE.root, root)
        argv = [a.replace(KSERVE.root, str(root)) for a in container["args"]]
        assert argv[:2] == ["torchserve", "--foreground"] and argv[-1] == "--ncs"
        assert argv[argv.index("--model-store") + 1] == f"{root}/model-store"
        assert argv[argv.index("--ts-config") + 1] == str(config_path)
        env = {e["name"]: e["value"].replace(KSERVE.root, str(root)) for e in container["env"]}
        assert env["TS_CONFIG_FILE"] == str(config_path)
        with EntrypointServer(argv, root, config, env, models=tuple(mix_record().shares)) as server:
            check_serving(server, cat_png)
    finally:
        remove(root)
