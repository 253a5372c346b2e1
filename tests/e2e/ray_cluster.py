"""A Ray cluster for a test module's fixture: started, handed over, stopped in `finally`, and no
process of it left after the stop (each one found is killed and named in the failure).

    @pytest.fixture(scope="module")
    def ray_serve(model_store):
        yield from running(RayServe(model_store, models=("digits",)))
"""

from __future__ import annotations

from collections.abc import Iterator

from serving.ray.ending import session_processes
from serving.ray.launcher import RayServe


def running(cluster: RayServe) -> Iterator[RayServe]:
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
