"""One model measured: served (`bench`: served.py, options.py, report.py) against its in-process limit
(`bench-inprocess`: inprocess.py), the stock baseline (baseline/) and a no-op handler's ceiling (noop/);
a generating model (`generation`), every family on a device (`device-check`). Run through `python -m benchmarks <verb>`.
"""
