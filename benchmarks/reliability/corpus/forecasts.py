"""Cases for a quantile forecaster, made from what its entry declares (window, horizon, range, limits):
both request forms answered, and each way to get a field wrong refused with the field it names."""

from __future__ import annotations

import json
from typing import List

from benchmarks.reliability.corpus.case import FORECASTER, Case, invalid, valid
from handlers.families.forecaster import ForecasterSettings

JSON = "application/json"


def _json(value) -> bytes:
    return json.dumps(value).encode()  # writes NaN and Infinity as Python's json reads them


def cases(settings: ForecasterSettings) -> List[Case]:
    s = settings
    low = 0.0 if s.min is None else s.min
    high = low + 100.0 if s.max is None else s.max
    history = [low + (high - low) * (0.4 + 0.2 * (i % 7) / 7) for i in range(s.window)]
    one = {"history": history}

    def with_first(value):
        return {"history": [value] + history[1:]}

    out = [
        valid("one series", FORECASTER, _json(one), JSON),
        valid("no content type (JSON)", FORECASTER, _json(one), None),
        valid("a longer history (the last window is read)", FORECASTER, _json({"history": history * 2}), JSON),
        valid("a shorter horizon", FORECASTER, _json({**one, "horizon": 1}), JSON),
        valid("thresholds and alert_within", FORECASTER,
              _json({**one, "thresholds": [low, high], "alert_within": 1}), JSON),
        valid("two series", FORECASTER, _json({"series": [one, {**one, "horizon": 1}]}), JSON),
        valid("integers", FORECASTER, _json({"history": [int(v) for v in history]}), JSON),
        invalid("empty body", FORECASTER, b"", JSON, 400, "malformed JSON"),
        invalid("malformed JSON", FORECASTER, b'{"history": [1, 2', JSON, 400, "malformed JSON"),
        invalid("JSON list, not an object", FORECASTER, _json(history), JSON, 400, "JSON object"),
        invalid("no history", FORECASTER, _json({"horizon": 1}), JSON, 400, "history"),
        invalid("history not a list", FORECASTER, _json({"history": "1,2,3"}), JSON, 400, "history"),
        invalid("history shorter than the window", FORECASTER, _json({"history": history[1:]}), JSON, 400,
                "history"),
        invalid("history longer than max_history", FORECASTER, _json({"history": [low] * (s.max_history + 1)}),
                JSON, 400, "history"),
        invalid("strings in history", FORECASTER, _json(with_first("12")), JSON, 400, "history"),
        invalid("null in history", FORECASTER, _json(with_first(None)), JSON, 400, "history"),
        invalid("nested history", FORECASTER, _json({"history": [history]}), JSON, 400, "history"),
        invalid("NaN in history", FORECASTER, _json(with_first(float("nan"))), JSON, 400, "NaN"),
        invalid("infinity in history", FORECASTER, _json(with_first(float("inf"))), JSON, 400, "infinity"),
        invalid("horizon above the trained one", FORECASTER, _json({**one, "horizon": s.horizon + 1}), JSON, 400,
                "horizon"),
        invalid("horizon zero", FORECASTER, _json({**one, "horizon": 0}), JSON, 400, "horizon"),
        invalid("horizon a fraction", FORECASTER, _json({**one, "horizon": 1.5}), JSON, 400, "horizon"),
        invalid("horizon a string", FORECASTER, _json({**one, "horizon": "4"}), JSON, 400, "horizon"),
        invalid("thresholds not numbers", FORECASTER, _json({**one, "thresholds": ["high"]}), JSON, 400,
                "thresholds"),
        invalid("NaN threshold", FORECASTER, _json({**one, "thresholds": [float("nan")]}), JSON, 400, "thresholds"),
        invalid("too many thresholds", FORECASTER, _json({**one, "thresholds": [low] * (s.max_thresholds + 1)}),
                JSON, 400, "thresholds"),
        invalid("alert_within without thresholds", FORECASTER, _json({**one, "alert_within": 1}), JSON, 400,
                "alert_within"),
        invalid("alert_within past the horizon", FORECASTER,
                _json({**one, "horizon": 1, "thresholds": [low], "alert_within": 2}), JSON, 400, "alert_within"),
        invalid("unknown field", FORECASTER, _json({**one, "colour": "red"}), JSON, 400, "colour"),
        invalid("series empty", FORECASTER, _json({"series": []}), JSON, 400, "series"),
        invalid("series not a list", FORECASTER, _json({"series": one}), JSON, 400, "series"),
        invalid("too many series", FORECASTER, _json({"series": [one] * (s.max_series + 1)}), JSON, 400, "series"),
        invalid("one bad series of two", FORECASTER, _json({"series": [one, {"history": history[:2]}]}), JSON, 400,
                "series[1].history"),
        invalid("series beside history", FORECASTER, _json({"series": [one], "history": history}), JSON, 400,
                "history"),
        invalid("XML", FORECASTER, b"<history/>", "application/xml", 415, "not supported"),
    ]
    if s.min is not None:
        out.append(invalid("history below min", FORECASTER, _json(with_first(s.min - 1)), JSON, 400, "below min"))
    if s.max is not None:
        out.append(invalid("history above max", FORECASTER, _json(with_first(s.max + 1)), JSON, 400, "above max"))
    return out
