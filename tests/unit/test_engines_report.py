"""The engines verb's pure parts: each Ray arm against TorchServe's, and the report's tables."""

from benchmarks.bench.engines import compare, cpu_per_request, markdown


def row(engine: str, capacity: float, p50: float, pss: float, ready: float = 20.0, model_pss: float = 0.5,
        cpu_ms: float = 2.0) -> dict:
    return {"model": "minilm", "engine": engine, "from": "config.properties",
            "settings": {"minWorkers": 1, "maxWorkers": 1, "batchSize": 4, "maxBatchDelay": 5, "threads": 2},
            "ready_s": ready, "idle": {"pss_gib": pss, "model_pss_gib": model_pss, "rss_gib": 2 * pss, "processes": 3},
            "p50_1_ms": p50, "cpu": {"model_ms": cpu_ms / 2, "engine_ms": cpu_ms / 4, "load_ms": cpu_ms / 4,
                                     "total_ms": cpu_ms, "requests": 1000},
            "closed_rps": 2 * capacity, "capacity_rps": capacity, "capacity_p99_ms": 40.0 if capacity else None,
            "capacity_samples": 1200 if capacity else None, "points": [{}, {}]}


def test_ray_arms_are_judged_against_torchserve_of_the_same_model():
    rows = [row("TorchServe", 100.0, 10.0, 1.0), row("Ray (proxy)", 50.0, 13.5, 2.0, ready=41.0, model_pss=0.8),
            row("Ray (HAProxy)", 95.0, 11.0, 3.0, model_pss=0.7, cpu_ms=3.0)]
    proxy, haproxy = compare(rows)
    assert (proxy["capacity_x"], proxy["p50_delta_ms"], proxy["pss_x"], proxy["model_pss_x"]) == (0.5, 3.5, 2.0, 1.6)
    assert proxy["met"] == {"capacity": False, "p50": False, "memory": False, "ready": False}
    assert (haproxy["capacity_x"], haproxy["p50_delta_ms"], haproxy["pss_x"], haproxy["model_pss_x"]) == (0.95, 1.0, 3.0, 1.4)
    assert all(haproxy["met"].values())  # the cluster's own processes (3x here) are shown, not judged
    assert (proxy["cpu_x"], haproxy["cpu_x"]) == (1.0, 1.5)
    assert (proxy["closed_x"], haproxy["closed_x"]) == (0.5, 0.95)


def test_cpu_per_request_splits_the_model_processes_from_the_rest_of_the_engine():
    before = {1: (True, 10.0), 2: (False, 5.0)}
    after = {1: (True, 13.0), 2: (False, 6.0), 3: (False, 0.5)}  # 3 started between the readings
    cpu = cpu_per_request(before, after, load_s=0.5, requests=1000)
    assert cpu == {"model_ms": 3.0, "engine_ms": 1.5, "load_ms": 0.5, "total_ms": 5.0, "requests": 1000}
    assert cpu_per_request({}, {}, 0.0, 0)["total_ms"] == 0.0  # no request answered: no division by zero


def test_the_generation_rows_are_each_against_torchserves_best():
    rows = [row("TorchServe", 100.0, 10.0, 1.0)]
    gen = {"model": "tinylm", "rows": [
        {"engine": "TorchServe async, 1 worker(s) x 2 thread(s)", "tokens_per_s": 900.0, "ttft_p50_ms": 20, "ttft_p90_ms": 30},
        {"engine": "TorchServe async, 2 worker(s) x 1 thread(s)", "tokens_per_s": 1000.0, "ttft_p50_ms": 20, "ttft_p90_ms": 30},
        {"engine": "Ray Serve (HAProxy), 2 replica(s) x 1 thread(s)", "tokens_per_s": 1500.0, "ttft_p50_ms": 20,
         "ttft_p90_ms": 30}]}
    text = markdown({"when": "now", "command": "cmd", "cpus": 2, "clients": 8, "rows": rows, "compare": [],
                     "generation": gen})
    assert "| Ray Serve (HAProxy), 2 replica(s) x 1 thread(s) | 1500.0 | 1.50x |" in text
    assert "| TorchServe async, 1 worker(s) x 2 thread(s) | 900.0 | 0.90x |" in text


def test_no_capacity_on_torchserve_gives_no_ratio_and_the_report_still_renders():
    rows = [row("TorchServe", 0.0, 10.0, 1.0), row("Ray (proxy)", 50.0, 10.0, 1.0)]
    (only,) = compare(rows)
    assert only["capacity_x"] is None and not only["met"]["capacity"]
    text = markdown({"when": "now", "command": "cmd", "cpus": 2, "clients": 8, "rows": rows,
                     "compare": [only], "generation": None})
    assert "| minilm | Ray (proxy) | no TorchServe point (missed) |" in text
    assert "| minilm | TorchServe | 1w, batch 4, 5 ms, 2 thr (config.properties) |" in text
    assert "no point within the SLO (2 tried)" in text
    rows = [row("TorchServe", 30.0, 10.0, 1.0), row("Ray (HAProxy)", 0.0, 12.0, 1.0)]
    text = markdown({"when": "now", "command": "cmd", "cpus": 2, "clients": 8, "rows": rows,
                     "compare": compare(rows), "generation": None})
    assert "| minilm | Ray (HAProxy) | none within the SLO (missed) |" in text
