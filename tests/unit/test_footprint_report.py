"""The footprint verb's pure parts: each process's role, medians per engine over rounds, the report."""

from types import SimpleNamespace

import pytest

from benchmarks.bench.footprint import OTHER, markdown, role, summary


def proc(name: str, *cmdline: str):
    return SimpleNamespace(name=lambda: name, cmdline=lambda: list(cmdline))


@pytest.mark.parametrize(("p", "want"), [
    (proc("python", "/v/bin/python", "/v/lib/ts/model_service_worker.py", "--sock-type", "unix"), "model processes"),
    (proc("ray::ServeReplica:minilm:Archive"), "model processes"),
    (proc("ray::ServeReplica:ingress:Ingress"), "ingress replica"),
    (proc("java", "/usr/bin/java", "-Dmodel_server_home=/x", "org.pytorch.serve.ModelServer"), "frontend (JVM)"),
    (proc("ray::ServeController.listen_for_change"), "Serve controller and proxies"),
    (proc("ray", "/v/bin/python", "/v/bin/ray", "start", "--block", "--head"), "node (ray start)"),
    (proc("gcs_server", "/v/ray/core/src/ray/gcs/gcs_server"), OTHER),
    (proc("raylet", "/v/raylet", "--java_worker_command=", "--cpp_worker_command="), OTHER),
])
def test_each_process_gets_its_role(p, want):
    assert role(p) == want


def run(engine: str, ready: float, pss_model: float, pss_rest: float, models: int = 4) -> dict:
    roles = {"model processes": {"processes": models, "pss_mib": pss_model},
             "frontend (JVM)" if engine == "torchserve" else OTHER: {"processes": 1, "pss_mib": pss_rest}}
    total = pss_model + pss_rest
    return {"engine": engine, "models": models, "ready_s": ready, "stop_s": 2.0, "roles": roles,
            "total": {"processes": models + 1, "pss_mib": total}, "pss_per_model_mib": total / models}


def test_medians_per_engine_and_ratios_against_the_first():
    runs = [run("torchserve", 20.0, 1000.0, 200.0), run("ray", 30.0, 1200.0, 600.0),
            run("ray", 50.0, 1300.0, 700.0), run("torchserve", 30.0, 1100.0, 200.0)]
    ts, ray = summary(runs, ("torchserve", "ray"))
    assert (ts["ready_s"], ts["pss_mib"], ts["pss_per_model_mib"], ts["model_pss_mib"]) == (25.0, 1250.0, 312.5, 1050.0)
    assert (ray["ready_s"], ray["pss_mib"], ray["model_pss_mib"], ray["rounds"]) == (40.0, 1900.0, 1250.0, 2)
    text = markdown(runs, [ts, ray], "cmd")
    assert "| Ray Serve (HAProxy) | 4 | 2 | 40.0 (1.60x) | 1900 | 475 (1.52x) | 1250 (1.19x) | 2.0 |" in text
    assert "| 2, TorchServe | 1100 (4) | 200 (1) | - |" in text
