"""Cases for a quantile forecaster, made from what its entry declares (window, horizon, range, limits):
both request forms answered, and each way to get a field wrong refused with the field it names."""

from __future__ import annotations

import json

from handlers.families.cases import Case, invalid, nested, valid
from handlers.families.forecaster_settings import ForecasterSettings

JSON = "application/json"


def _json(value) -> bytes:
    return json.dumps(value).encode()  # writes NaN and Infinity as Python's json reads them



def cases(settings: ForecasterSettings) -> list[Case]:
    s = settings
    low = 0.0 if s.min is None else s.min
    high = low + 100.0 if s.max is None else s.max
    history = [low + (high - low) * (0.4 + 0.2 * (i % 7) / 7) for i in range(s.window)]
    one = {"history": history}

    def with_first(value):
        return {"history": [value] + history[1:]}

    out = [
        valid("one series", _json(one), JSON),
        valid("no content type (JSON)", _json(one), None),
        valid("a longer history (the last window is read)", _json({"history": history * 2}), JSON),
        valid("a shorter horizon", _json({**one, "horizon": 1}), JSON),
        valid("thresholds and alert_within",
              _json({**one, "thresholds": [low, high], "alert_within": 1}), JSON),
        valid("two series", _json({"series": [one, {**one, "horizon": 1}]}), JSON),
        valid("integers", _json({"history": [int(v) for v in history]}), JSON),
        invalid("empty body", b"", JSON, 400, "malformed JSON"),
        invalid("malformed JSON", b'{"history": [1, 2', JSON, 400, "malformed JSON"),
        invalid("JSON list, not an object", _json(history), JSON, 400, "JSON object"),
        invalid("no history", _json({"horizon": 1}), JSON, 400, "history"),
        invalid("history not a list", _json({"history": "1,2,3"}), JSON, 400, "history"),
        invalid("history shorter than the window", _json({"history": history[1:]}), JSON, 400,
                "history"),
        invalid("history longer than max_history", _json({"history": [low] * (s.max_history + 1)}),
                JSON, 400, "history"),
        invalid("strings in history", _json(with_first("12")), JSON, 400, "history"),
        invalid("null in history", _json(with_first(None)), JSON, 400, "history"),
        invalid("nested history", _json({"history": [history]}), JSON, 400, "history"),
        invalid("NaN in history", _json(with_first(float("nan"))), JSON, 400, "NaN"),
        invalid("infinity in history", _json(with_first(float("inf"))), JSON, 400, "infinity"),
        invalid("horizon above the trained one", _json({**one, "horizon": s.horizon + 1}), JSON, 400,
                "horizon"),
        invalid("horizon zero", _json({**one, "horizon": 0}), JSON, 400, "horizon"),
        invalid("horizon a fraction", _json({**one, "horizon": 1.5}), JSON, 400, "horizon"),
        invalid("horizon a string", _json({**one, "horizon": "4"}), JSON, 400, "horizon"),
        invalid("thresholds not numbers", _json({**one, "thresholds": ["high"]}), JSON, 400,
                "thresholds"),
        invalid("NaN threshold", _json({**one, "thresholds": [float("nan")]}), JSON, 400, "thresholds"),
        invalid("too many thresholds", _json({**one, "thresholds": [low] * (s.max_thresholds + 1)}),
                JSON, 400, "thresholds"),
        invalid("alert_within without thresholds", _json({**one, "alert_within": 1}), JSON, 400,
                "alert_within"),
        invalid("alert_within past the horizon",
                _json({**one, "horizon": 1, "thresholds": [low], "alert_within": 2}), JSON, 400, "alert_within"),
        invalid("unknown field", _json({**one, "colour": "red"}), JSON, 400, "colour"),
        invalid("series empty", _json({"series": []}), JSON, 400, "series"),
        invalid("series not a list", _json({"series": one}), JSON, 400, "series"),
        invalid("too many series", _json({"series": [one] * (s.max_series + 1)}), JSON, 400, "series"),
        invalid("one bad series of two", _json({"series": [one, {"history": history[:2]}]}), JSON, 400,
                "series[1].history"),
        invalid("series beside history", _json({"series": [one], "history": history}), JSON, 400,
                "history"),
        invalid("XML", b"<history/>", "application/xml", 415, "not supported"),
        invalid("a history value past float32 (1e39)", _json(with_first(1e39)), JSON, 400, "overflows float32"),
        invalid("true in history", _json(with_first(True)), JSON, 400, "true/false"),
        invalid("history all true/false", _json({"history": [True] * s.window}), JSON, 400, "true/false"),
        invalid("a true threshold", _json({**one, "thresholds": [True, high]}), JSON, 400, "thresholds"),
        invalid("history nested 100 levels deep", _json({"history": nested(history, 100)}), JSON, 400, "nested"),
        invalid("JSON over the body limit", _json({**one, "pad": "x" * s.max_body_bytes}), JSON, 413, "limit"),
    ]
    if s.min is not None:
        out.append(invalid("history below min", _json(with_first(s.min - 1)), JSON, 400, "below min"))
    if s.max is not None:
        out.append(invalid("history above max", _json(with_first(s.max + 1)), JSON, 400, "above max"))
    return out
