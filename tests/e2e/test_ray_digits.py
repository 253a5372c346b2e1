"""The digits archive on Ray Serve (serving/ray/): the same answers as its handler in-process, a bad
request's own 4xx beside batch-mates' 200, TorchServe's token check, and a stop that leaves no process."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from serving.fake_context import extract
from serving.ray.launcher import RayServe, session_processes
from serving.repo import REPO_ROOT
from serving.ts_config import ModelSettings
from tests.inprocess import make_handler

pytestmark = pytest.mark.e2e

MODEL = "digits"
EXAMPLES = sorted((REPO_ROOT / "models" / MODEL).glob("example_*.*"))
BATCH = ModelSettings(batch_size=4, max_batch_delay_ms=300)


def content_type(path) -> str:
    return "application/json" if path.suffix == ".json" else "application/x-npy"


@pytest.fixture(scope="module")
def ray_serve(model_store):
    cluster = RayServe(model_store, models=(MODEL,), settings={MODEL: BATCH})
    marker = None
    try:
        cluster.start()
        marker = str(cluster.workdir)
        yield cluster
    finally:
        cluster.stop()
        left = session_processes(marker) if marker else []
        for proc in left:
            proc.kill()
        assert not left, f"processes left after stop: {[(p.pid, p.name()) for p in left]}"


@pytest.fixture(scope="module")
def in_process(model_store, tmp_path_factory):
    handler, context = make_handler(extract(model_store / f"{MODEL}.mar", tmp_path_factory.mktemp(MODEL)), MODEL)

    def answer(path) -> object:
        body = path.read_bytes()
        context.headers[0] = {"explain": "False", "url_path": "", "content-type": content_type(path)}
        data = json.loads(body) if path.suffix == ".json" else body
        (out,) = handler.handle([{"body": data}], context)
        assert context.statuses.get(0, (200, ""))[0] == 200, context.statuses
        return json.loads(out)

    return answer


def test_digits_on_ray_answer_as_in_process(ray_serve, in_process):
    assert EXAMPLES, "models/digits/example_* missing"
    for path in EXAMPLES:
        reply = ray_serve.predict(MODEL, path.read_bytes(), content_type(path))
        assert reply.status_code == 200, (path.name, reply.text)
        assert reply.json() == in_process(path), path.name


def test_a_bad_request_gets_its_own_4xx_while_its_batch_mates_get_200(ray_serve):
    good = (REPO_ROOT / "models" / MODEL / "example_9.json").read_bytes()
    bodies = [good, b'{"inputs": "not a tensor"}', good, good]
    with ThreadPoolExecutor(len(bodies)) as pool:  # inside one batch window (300 ms, 4 at most)
        replies = list(pool.map(lambda b: ray_serve.predict(MODEL, b, "application/json"), bodies))
    assert [r.status_code // 100 for r in replies] == [2, 4, 2, 2], [(r.status_code, r.text[:200]) for r in replies]
    assert replies[0].json() == replies[2].json() == replies[3].json()


def test_the_inference_key_is_checked_as_torchserve_does(ray_serve):
    good = (REPO_ROOT / "models" / MODEL / "example_9.json").read_bytes()
    for token in ("", "wrong"):
        reply = ray_serve.predict(MODEL, good, "application/json", token=token)
        assert reply.status_code == 400 and reply.json()["type"] == "InvalidKeyException"
