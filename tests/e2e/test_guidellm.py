"""guidellm (the vLLM project's benchmark CLI), unchanged, against a real TorchServe serving tinylm
in the async mode: its stock OpenAI requests (streamed, `stream_options` with vLLM's
`continuous_usage_stats`, `ignore_eos` and a fixed `max_tokens`) all succeed, each with the output
length it asked for, on the completions and chat routes. Its target is the model's OpenAI base
(`/predictions/<model>/<version>`, guidellm adds `/v1/...`); its health check goes to `v1/models`
(TorchServe routes no `/health` under a model); its tokenizer is the archive's own folder, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.e2e

LM, VERSION = "tinylm", "1.0"
REQUESTS, OUTPUT_TOKENS = 6, 8
TOKENIZER = REPO_ROOT / "models" / LM / "trained"


def guidellm(server, request_format: str, out: Path, base: str = f"/predictions/{LM}/{VERSION}") -> dict:
    """One guidellm run against the OpenAI routes under `base` (Ray Serve also serves them at the root)."""
    backend = {"kind": "openai_http", "target": f"{server.inference_url}{base}", "model": LM,
               "request_format": request_format, "api_key": server.tokens.inference,
               "api_routes": {"/health": "v1/models"}, "http2": False, "timeout": 60}
    command = [str(Path(sys.executable).parent / "guidellm"), "run",
               "--backend", json.dumps(backend),
               "--profile", json.dumps({"kind": "concurrent", "streams": 2}),
               "--constraint", json.dumps({"kind": "max_requests", "count": REQUESTS}),
               "--data", json.dumps({"kind": "synthetic_text", "prompt_tokens": 16, "output_tokens": OUTPUT_TOKENS}),
               "--tokenizer", json.dumps({"kind": "huggingface_auto", "model": str(TOKENIZER)}),
               "--output", json.dumps({"kind": "json", "path": str(out)}),
               "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return json.loads(out.read_text())["benchmarks"][0]


@pytest.mark.parametrize("request_format", ["/v1/completions", "/v1/chat/completions"])
def test_guidellms_stock_requests_all_succeed_with_the_length_asked(async_lm_server, tmp_path, request_format):
    run = guidellm(async_lm_server, request_format, tmp_path / "guidellm.json")
    totals = run["metrics"]["request_totals"]
    errors = [r.get("info", {}).get("error") for r in run["requests"]["errored"]]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (REQUESTS, 0, 0), errors[:2]
    sent = json.loads(run["requests"]["successful"][0]["request_args"])["body"]
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True} and sent["ignore_eos"]
    assert [r["output_tokens"] for r in run["requests"]["successful"]] == [OUTPUT_TOKENS] * REQUESTS
