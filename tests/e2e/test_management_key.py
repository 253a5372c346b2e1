"""The management key is a credential, not a shell: a workflow archive (.war) whose handler would run
code on the server is refused by a real TorchServe, whichever URL or body form carries it, and its
code never runs.

TorchServe 0.12's workflow API (`POST /workflows?url=...` on the management port) registers a .war and
starts a worker on its Python handler without looking at `enable_model_api`. What keeps it shut is
the configuration every server of ours is written with: `allowed_urls` that no URL matches and a
workflow store where no archive can be (serving/ts_config.py, LOCKED_PROPERTIES).
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.launcher import TorchServe

pytestmark = pytest.mark.e2e

HANDLER = "wf_probe.py"
# The handler module runs this at import, when TorchServe's worker loads the workflow's function node.
HANDLER_CODE = """\
import pathlib

pathlib.Path({marker!r}).write_text("the workflow handler ran")


def pre(data, context):
    return data
"""
# One function node: TorchServe registers it as the model "<workflow>__pre" served by HANDLER:pre.
SPEC = "models:\n  min-workers: 1\ndag:\n  pre: []\n"


def write_war(folder: Path, name: str, marker: Path) -> Path:
    """A minimal workflow archive, as torch-workflow-archiver lays it out (WorkflowArchive at 0.12 reads
    WAR-INF/MANIFEST.json, then the spec and the handler it names)."""
    manifest = {"createdOn": "01/01/2026 00:00:00", "archiverVersion": "0.2.1",
                "workflow": {"workflowName": name, "specFile": "spec.yaml", "handler": HANDLER}}
    war = folder / f"{name}.war"
    with zipfile.ZipFile(war, "w") as archive:
        archive.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("spec.yaml", SPEC)
        archive.writestr(HANDLER, HANDLER_CODE.format(marker=str(marker)))
    return war


@pytest.fixture()
def war_server(tmp_path: Path) -> Iterator[str]:
    """An HTTP server on loopback offering the archive folder: the http:// way in."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture()
def bare_server(tmp_path: Path, repo_root: Path) -> Iterator[TorchServe]:
    """The repository's config.properties over an empty model store (no model to wait for)."""
    store = tmp_path / "store"
    store.mkdir()
    with TorchServe(store, base_config=repo_root / "config.properties", extra_properties={"load_models": ""}) as ts:
        yield ts


def test_the_management_key_registers_no_workflow_and_runs_none_of_its_code(bare_server, tmp_path, war_server):
    """Each way in with its own archive and marker, so that one refusal cannot hide another."""
    client, store = bare_server.client, bare_server.spec.model_store
    wars = tmp_path / "wars"
    wars.mkdir()
    markers = {name: tmp_path / f"{name}-ran" for name in ("by_file", "by_http", "by_json", "in_store")}
    by_file, by_http, by_json = (write_war(wars, name, markers[name]) for name in ("by_file", "by_http", "by_json"))
    # An archive already in the model store (TorchServe's default workflow store is the model store).
    write_war(store, "in_store", markers["in_store"])
    attempts = {
        "by_file": dict(params={"url": by_file.as_uri()}),
        "by_http": dict(params={"url": f"{war_server}/wars/{by_http.name}"}),
        "by_json": dict(json={"url": by_json.as_uri()}),
        "in_store": dict(params={"url": "in_store.war"}),
    }
    answers = {how: client.management("POST", "/workflows", **kwargs) for how, kwargs in attempts.items()}
    # Registration is synchronous (the worker is started before the answer); a little slack anyway.
    time.sleep(1.0)
    ran = sorted(name for name, marker in markers.items() if marker.exists())
    registered = client.management("GET", "/workflows").json().get("workflows", [])
    models = client.management("GET", "/models").json().get("models", [])
    summary = "; ".join(f"{how}: {r.status_code} {' '.join(r.text.split())[:140]}" for how, r in answers.items())
    assert not ran, f"the workflow handler ran on the server ({', '.join(ran)}): {summary}"
    assert not registered and not models, f"registered: {registered} {models}; {summary}"
    assert all(400 <= r.status_code < 500 for r in answers.values()), summary
    assert sorted(p.name for p in store.iterdir()) == ["in_store.war"], "nothing copied into the model store"
    assert client.ping().status_code == 200, "the server must live on"
