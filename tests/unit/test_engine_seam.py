"""The engine seam: every handlers module but TorchServe's adapter imports where TorchServe is not
installed, and a batch runs through the request loop behind an adapter of another engine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent('''
    import importlib, json, pkgutil, sys
    from pathlib import Path

    class NoTorchServe:
        """A meta path hook: `ts` and anything under it cannot be imported."""
        def find_spec(self, name, path=None, target=None):
            if name == "ts" or name.startswith("ts."):
                raise ImportError(f"no TorchServe here ({name})")
            return None

    sys.meta_path.insert(0, NoTorchServe())
    import handlers
    ADAPTER = "handlers.engines.torchserve"
    names = sorted(m.name for m in pkgutil.walk_packages(handlers.__path__, "handlers."))
    for name in names:
        if name != ADAPTER and not name.startswith("handlers.engines.torchserve"):
            importlib.import_module(name)
    assert "ts" not in sys.modules

    from handlers.deadlines import Arrival
    from handlers.engines import Worker
    from handlers.handler import Handler
    from handlers.request import open_request

    class Sink:
        def __init__(self):
            self.calls = []
        def time(self, name, ms, dims):
            self.calls.append(name)
        def count(self, name, value, dims, unit=None):
            self.calls.append(name)
        def gauge(self, name, value, unit, dims):
            self.calls.append(name)

    class OtherEngine:
        """An engine that is not TorchServe: its context is a dict."""
        name = "other"
        sink = Sink()
        @staticmethod
        def worker(context):
            return Worker(context["name"], Path(context["dir"]), max_batch_size=4, model_config=context["config"])
        @staticmethod
        def requests(data, context, default_deadline_ms=0, indices=None):
            arrival = Arrival.now()
            return [open_request(i, str(i), {"Content-Type": "application/json"}, body, arrival,
                                 default_deadline_ms) for i, body in enumerate(data)]
        @staticmethod
        def reply(context, requests, replies):
            context["statuses"] = [r.status for r in replies]
            return [r.body for r in replies]
        @classmethod
        def metrics(cls, context):
            return cls.sink

    import yaml
    model_dir = Path(sys.argv[1])
    config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
    config["handler"].setdefault("runtime", {})["warmup"] = False
    context = {"name": "tiny_tensor", "dir": str(model_dir), "config": config}
    handler = Handler(engine=OtherEngine)
    handler.initialize(context)
    good = {"inputs": [[[0.0] * 4] * 4]}
    answers = handler.handle([good, {"inputs": "not numbers"}, good], context)
    assert "ts" not in sys.modules
    print(json.dumps({"statuses": context["statuses"], "first": json.loads(answers[0]),
                      "metrics": sorted(set(OtherEngine.sink.calls))}))
''')


def test_the_handlers_import_and_serve_without_torchserve(tiny_dirs):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_dirs["tiny_tensor"])], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["statuses"] == [200, 400, 200]
    assert "outputs" in result["first"] or result["first"]
    assert "HandlerBatches" in result["metrics"]


def test_the_generation_figures_go_into_the_engines_sink_without_torchserve(monkeypatch):
    """generation/metrics.emit writes through the adapter's MetricsSink, never through `ts.metrics`."""
    from types import SimpleNamespace

    from handlers.generation.metrics import Figures, emit

    for name in [name for name in sys.modules if name == "ts" or name.startswith("ts.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ts", None)  # `import ts...` raises ImportError here

    calls = []

    class Sink:
        def time(self, name, ms, dims):
            calls.append(("time", name, ms, dims))

        def count(self, name, value, dims, unit=None):
            calls.append(("count", name, value, dims))

        def gauge(self, name, value, unit, dims):
            calls.append(("gauge", name, value, dims))

    engine = SimpleNamespace(cache_bytes=1024, prefix_cache=None)
    emit(Sink(), "lm", Figures(tokens=3, ttft_ms=[5.0], running=2), engine, tokens_per_s=12.5)
    got = {name: (kind, value) for kind, name, value, _ in calls}
    assert got["GenerationTokens"] == ("count", 3) and got["GenerationTimeToFirstTokenMs"] == ("count", 5.0)
    assert got["GenerationRunningSequences"] == ("gauge", 2) and got["GenerationTokensPerSecond"] == ("gauge", 12.5)
    assert all(dims[:2] == (("ModelName", "lm"), ("Level", "Model")) for *_, dims in calls)
