"""The quantile forecaster family: the batch's array post-processing against the per-value loop,
no crossing, clipping, alerts, validation naming fields, and a tiny model's archive in-process (the
trained co2 model's: tests/archives)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from handlers.encoding import json_bytes
from handlers.errors import BadInput, ConfigError, PayloadTooLarge, UnsupportedMediaType
from handlers.families.forecaster import ForecasterSettings, QuantileForecaster
from handlers.families.quantile_post import (
    RowOptions,
    forecast_rows,
    forecast_rows_loop,
    quantile_key,
)
from tests.unit.conftest import make_handler

pytestmark = pytest.mark.unit

KEYS = ["p10", "p50", "p90"]


def random_case(seed: int, rows: int = 40, steps: int = 12):
    rng = np.random.default_rng(seed)
    values = rng.normal(5, 3, (rows, steps, 3)).astype(np.float32)  # crossing on purpose
    options = []
    for _ in range(rows):
        horizon = int(rng.integers(1, steps + 1))
        thresholds = tuple(float(t) for t in rng.normal(6, 3, int(rng.integers(0, 4))).round(2))
        options.append(RowOptions(horizon, thresholds, int(rng.integers(1, horizon + 1)) if thresholds else 0))
    return values, options


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("bounds", [(None, None), (0.0, None), (2.0, 9.5)])
def test_arrays_answer_byte_for_byte_as_the_per_value_loop(seed, bounds):
    values, options = random_case(seed)
    fast = forecast_rows(values, options, KEYS, *bounds)
    slow = forecast_rows_loop(values, options, KEYS, *bounds)
    assert [json_bytes(a) for a in fast] == [json_bytes(a) for a in slow]
    assert any(a["alerts"] for a in fast)


def test_quantiles_never_cross_and_stay_in_range():
    values, options = random_case(7)
    assert (np.diff(values, axis=-1) < 0).any()  # the model's raw outputs do cross
    for answer in forecast_rows(values, options, KEYS, 0.0, 10.0):
        table = np.array([answer["quantiles"][k] for k in KEYS])
        assert table.shape[1] == answer["horizon"]
        assert (np.diff(table, axis=0) >= 0).all() and table.min() >= 0 and table.max() <= 10


def test_alerts_name_the_first_step_within_the_window():
    steps = np.arange(1, 9, dtype=np.float32)  # p50 = 1, 2, ..., 8
    values = np.stack([steps - 1, steps, steps + 1], axis=-1)[None]
    [answer] = forecast_rows(values, [RowOptions(8, (3.0, 4.5, 100.0), 5)], KEYS, None, None)
    first = [alert["first_step"] for alert in answer["alerts"]]
    assert first[0] == {"p10": 4, "p50": 3, "p90": 2}
    assert first[1] == {"p10": None, "p50": 5, "p90": 4}  # p10 reaches 4.5 only at step 6: past the window
    assert first[2] == {"p10": None, "p50": None, "p90": None}


def test_quantile_keys():
    assert [quantile_key(q) for q in (0.1, 0.5, 0.9, 0.025, 0.99)] == ["p10", "p50", "p90", "p2.5", "p99"]


def family(**changes) -> QuantileForecaster:
    settings = ForecasterSettings(**{"window": 8, "horizon": 4, "quantiles": (0.1, 0.5, 0.9), "min": 0.0,
                                     **changes})
    return QuantileForecaster(settings, model_dir=None)


HISTORY = [1.0, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("body, field", [
    ({"history": HISTORY[:-1]}, "history"),
    ({"history": HISTORY[:-1] + [math.nan]}, "history[7]"),
    ({"history": HISTORY[:-1] + [math.inf]}, "history[7]"),
    ({"history": HISTORY[:-1] + [-1]}, "history[7]"),
    ({"history": HISTORY[:-1] + ["8"]}, "history"),
    ({"history": HISTORY, "horizon": 5}, "horizon"),
    ({"history": HISTORY, "horizon": True}, "horizon"),
    ({"history": HISTORY, "thresholds": [None]}, "thresholds"),
    ({"history": HISTORY, "alert_within": 2}, "alert_within"),
    ({"history": HISTORY, "unit": "ppm"}, "unit"),
    ({"series": [{"history": HISTORY}, {"history": HISTORY, "horizon": 0}]}, "series[1].horizon"),
    ({"series": [{"history": HISTORY}] * 3}, "series"),
])
def test_each_bad_field_is_named(body, field):
    with pytest.raises(BadInput) as err:
        family(max_series=2).decode(json.dumps(body).encode(), "application/json")
    assert type(err.value) is BadInput and err.value.message.startswith(field), err.value.message


def test_limits_and_media_types():
    with pytest.raises(PayloadTooLarge):
        family(max_body_bytes=10).decode(json.dumps({"history": HISTORY}).encode(), "application/json")
    with pytest.raises(UnsupportedMediaType):
        family().decode(b"1,2,3", "text/csv")


def test_the_last_window_is_read():
    item = family().decode({"history": [100.0] * 5 + HISTORY, "horizon": 2}, "")
    assert item.windows.tolist() == [HISTORY] and item.options == (RowOptions(2),)


@pytest.mark.parametrize("changes, key", [({"window": 0}, "window"), ({"quantiles": (0.5, 0.1)}, "quantiles"),
                                          ({"quantiles": (0.1, 1.0)}, "quantiles"), ({"min": 5.0, "max": 1.0}, "min"),
                                          ({"max_history": 4}, "max_history")])
def test_settings_name_the_wrong_key(changes, key):
    with pytest.raises(ConfigError) as err:
        family(**changes)
    assert f"quantile_forecaster.{key}" in err.value.message


def run(handler, context, bodies):
    context.headers = {i: {"Content-Type": "application/json"} for i in range(len(bodies))}
    context.statuses = {}
    return [json.loads(a) for a in handler.handle([{"body": json.dumps(b).encode()} for b in bodies], context)]


def test_a_mixed_batch_is_answered_as_each_alone(tiny_dirs):
    """Series, horizons, alerts and a too-short history in one batch: the bad one is refused alone
    and every other answer is what its request gets alone."""
    handler, context = make_handler(tiny_dirs["tiny_forecast"], "tiny_forecast", batch_size=4)
    settings = handler.settings.family_settings
    rng = np.random.default_rng(3)
    history = [(300 + np.cumsum(rng.normal(0.1, 1.0, 3 * settings.window))).round(2).tolist() for _ in range(3)]
    latest = history[0]
    bodies = [{"history": latest, "horizon": 3, "thresholds": [latest[-1]], "alert_within": 3},
              {"history": latest[:settings.window - 1]},
              {"series": [{"history": history[1]}, {"history": latest, "horizon": 2}]},
              {"history": history[2]}]
    together = run(handler, context, bodies)
    assert set(context.statuses) == {1} and context.statuses[1][0] == 400
    assert "history" in together[1]["message"]
    for i in (0, 2, 3):  # the same to float32 rounding (a batch's matrix products may round differently)
        assert QuantileForecaster.answer_problem(settings, together[i]) is None, together[i]
        alone = run(handler, context, [bodies[i]])[0]
        for a, b in zip(alone.get("series", [alone]), together[i].get("series", [together[i]]), strict=True):
            assert a["alerts"] == b["alerts"] and a["horizon"] == b["horizon"]
            np.testing.assert_allclose(list(a["quantiles"].values()), list(b["quantiles"].values()), rtol=1e-6)
    assert [len(s["quantiles"]["p50"]) for s in together[2]["series"]] == [settings.horizon, 2]
    assert len(together[0]["alerts"]) == 1


@pytest.mark.parametrize("body, status, words", [
    ({"history": HISTORY[:-1] + [1e39]}, 400, "history[7]: 1e+39 overflows float32"),  # was: 200, null quantiles
    ({"series": [{"history": HISTORY}, {"history": [1e39] + HISTORY[1:]}]}, 400, "series[1].history[0]: 1e+39"),
    ({"history": HISTORY[:-1] + [True]}, 400, "history[7]: true/false"),  # was: 200, true read as 1.0
    ({"history": [True] * 8}, 400, "history: true/false"),
    ({"history": HISTORY, "thresholds": [True, 5.0]}, 400, "thresholds[0]: true/false"),  # was: 200, echoed true
    ({"history": HISTORY, "pad": "x" * (8 * 1024 * 1024)}, 413, "over the limit of 8388608"),  # was: 400 "pad"
    ({"history": HISTORY, "pad": json.loads("[" * 100 + "]" * 100)}, 400, "nested"),  # 100 levels deep
])
def test_hostile_requests_fail_alone(tiny_dirs, body, status, words):
    """The parsed body TorchServe hands over: a 4xx naming the field (never a 200 with null
    quantiles), its batch-mate answered as alone."""
    handler, context = make_handler(tiny_dirs["tiny_forecast"], "tiny_forecast", batch_size=2)
    good = {"history": [300.0 + i for i in range(8)]}
    alone = run(handler, context, [good])[0]
    context.headers = {0: {"Content-Type": "application/json"}, 1: {"Content-Type": "application/json"}}
    context.statuses = {}
    answers = [json.loads(a) for a in handler.handle([{"body": body}, {"body": good}], context)]
    assert context.statuses.get(0, (200,))[0] == status and words in answers[0]["message"], answers[0]
    assert 1 not in context.statuses and answers[1] == alone
