"""Finding free loopback ports and ending the process tree of one TorchServe, by pid only."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterable
from typing import Any

import psutil


def free_loopback_ports(count: int) -> tuple[int, ...]:
    """`count` distinct ports that were free on 127.0.0.1 a moment ago (all bound at once)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for sock in socks:
            sock.close()


def loopback_port_free(port: int) -> bool:
    """Whether `port` can be bound on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_free_everywhere(port: int) -> bool:
    """Whether `port` can be bound on every interface now (so on 127.0.0.1 too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))  # bound, never listened on  # noqa: S104
        except OSError:
            return False
    return True


def process(pid: int | None) -> psutil.Process | None:
    if pid is None:
        return None
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    return None


def tree(root: psutil.Process | None) -> list[psutil.Process]:
    """The root and all its descendants (TorchServe's Python workers are children of its JVM)."""
    if root is None:
        return []
    with contextlib.suppress(psutil.Error):
        return [root, *root.children(recursive=True)]
    return [root]


def tagged(env_key: str, env_value: str) -> list[psutil.Process]:
    """Our own processes whose environment carries env_key=env_value (orphaned workers too)."""
    found = []
    uid = os.getuid()
    for proc in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if proc.info["uids"].real != uid or proc.pid == os.getpid():
                continue
            if proc.environ().get(env_key) == env_value:
                found.append(proc)
    return found


def end(procs: Iterable[psutil.Process], grace_s: float = 10.0) -> list[psutil.Process]:
    """SIGTERM, wait up to grace_s, then SIGKILL what is left. Returns those it had to kill."""
    alive = [p for p in procs if p.is_running()]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    return alive


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def sigterm_as_interrupt() -> Any:
    """In the main thread, when SIGTERM has its default action: make it raise KeyboardInterrupt,
    so that `finally` blocks (a server's stop) run. Returns the handler to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def restore_sigterm(previous: Any) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
