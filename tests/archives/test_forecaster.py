"""The trained co2 model's archive in-process: a mixed batch answered as each request alone, and a
year-ahead median close to what happened."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import make_handler

pytestmark = pytest.mark.archives


def run(handler, context, bodies):
    context.headers = {i: {"Content-Type": "application/json"} for i in range(len(bodies))}
    context.statuses = {}
    return [json.loads(a) for a in handler.handle([{"body": json.dumps(b).encode()} for b in bodies], context)]


def test_the_real_archive_answers_a_mixed_batch_as_each_alone(archive_dirs):
    from models.co2.train import split, weekly_co2

    handler, context = make_handler(archive_dirs["co2"], "co2", batch_size=4)
    (_, _), (history, future) = split(weekly_co2())
    latest = history[-1].tolist()
    bodies = [{"history": latest, "horizon": 8, "thresholds": [375.0], "alert_within": 8},
              {"history": latest[:10]},
              {"series": [{"history": history[0].tolist()}, {"history": latest, "horizon": 3}]},
              {"history": history[100].tolist()}]
    together = run(handler, context, bodies)
    assert set(context.statuses) == {1} and context.statuses[1][0] == 400
    assert "history" in together[1]["message"]
    for i in (0, 2, 3):  # the same to float32 rounding (a batch's matrix products may round differently)
        alone = run(handler, context, [bodies[i]])[0]
        for a, b in zip(alone.get("series", [alone]), together[i].get("series", [together[i]]), strict=True):
            assert a["alerts"] == b["alerts"] and a["horizon"] == b["horizon"]
            np.testing.assert_allclose(list(a["quantiles"].values()), list(b["quantiles"].values()), rtol=1e-6)
    assert [len(s["quantiles"]["p50"]) for s in together[2]["series"]] == [52, 3]
    # A trained model: the median a year ahead is within a few ppm of what happened.
    p50 = np.array(together[3]["quantiles"]["p50"])
    assert np.abs(p50 - future[100]).mean() < 2.0
