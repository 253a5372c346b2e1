"""The co2 quantile forecaster through a real TorchServe: a batch that mixes one-series and
several-series requests with bad ones answers each on its own (bad fields named in 400s, the
others forecast, batched together), quantiles never cross, and the alerts are the ones the
per-value loop finds in the same quantiles."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from build.examples import Request
from handlers.families.quantile_post import RowOptions, forecast_rows_loop
from serving.repo import REPO_ROOT
from tests.e2e.helpers import answered, batches_since, formed_batches, post_together

pytestmark = pytest.mark.e2e

MODEL = "co2"


def request(body) -> Request:
    return Request(json.dumps(body).encode(), "application/json")


def test_a_mixed_batch_is_answered_request_by_request(server):
    latest = json.loads((REPO_ROOT / "models/co2/example_latest.json").read_text())["history"]
    p50 = answered(server.predict(MODEL, {"history": latest}), MODEL)["quantiles"]["p50"]
    # A threshold the median first reaches at step k + 1: an alert window of k steps must not see it.
    k = next(i for i in range(1, 26) if p50[i] - 0.01 > max(p50[:i]))
    threshold = p50[k] - 0.005
    good = [
        {"history": latest, "horizon": 26, "thresholds": [threshold, 400.0], "alert_within": k},
        {"history": latest, "horizon": 26, "thresholds": [threshold, 400.0], "alert_within": k + 1},
        {"series": [{"history": [v - 5.0 for v in latest]}, {"history": latest, "horizon": 4}]},
        {"history": [v + 10.0 for v in latest]},
    ]
    bad = {"horizon: 53": {"history": latest, "horizon": 53},
           "history[155]": {"history": latest[:-1] + [math.nan]},
           "series[1].history": {"series": [{"history": latest}, {"history": latest[:12]}]}}
    before = formed_batches(server, MODEL)
    responses = post_together(server, MODEL, [request(b) for b in good + list(bad.values())])

    for field, resp in zip(bad, responses[len(good):]):
        assert resp.status_code == 400, resp.text
        assert resp.json()["message"].startswith(field.split(":")[0]), resp.json()
    answers = [answered(resp, MODEL) for resp in responses[:len(good)]]
    assert answers[0]["alerts"][0]["first_step"]["p50"] is None
    assert answers[1]["alerts"][0]["first_step"]["p50"] == k + 1
    for answer, body in zip(answers[:2], good[:2]):  # the same alerts as the per-value loop finds
        table = np.array(list(answer["quantiles"].values()), np.float32).T[None]  # (1, steps, quantiles)
        options = RowOptions(26, tuple(body["thresholds"]), body["alert_within"])
        [expected] = forecast_rows_loop(table, [options], list(answer["quantiles"]), 0.0, None)
        assert answer["alerts"] == expected["alerts"]
        assert all(step is None for step in answer["alerts"][1]["first_step"].values())
    assert [len(s["quantiles"]["p50"]) for s in answers[2]["series"]] == [52, 4]
    # A series shifted by 10 ppm is forecast 10 ppm higher (the model scales each window by itself).
    np.testing.assert_allclose(answers[3]["quantiles"]["p50"], np.add(p50, 10.0), atol=0.01)
    formed = batches_since(server, MODEL, before, len(good) + len(bad))
    assert max(formed) > 1, formed  # the good and the bad went through the worker together
