"""The launcher's config for its servers: the repository's log4j2 file found from any directory,
and a batch delay TorchServe would misread refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from serving.errors import ConfigError
from serving.launch_spec import LaunchSpec, StartCommand, absolute_log_config
from serving.launcher import TorchServe
from serving.repo import DEFAULT_CONFIG, REPO_ROOT
from serving.ts_config import ModelSettings, ServerConfig

pytestmark = pytest.mark.unit


def test_the_shipped_config_points_at_the_shipped_log4j2_file():
    vmargs = ServerConfig.load(DEFAULT_CONFIG).get("vmargs")
    assert absolute_log_config(vmargs, REPO_ROOT) == f"-Dlog4j.configurationFile={REPO_ROOT / 'log4j2.xml'}"


def test_relative_paths_start_at_the_given_root_and_other_words_stay(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "log.xml").write_text("<Configuration/>")
    got = absolute_log_config("-Xmx1g -Dlog4j.configurationFile=conf/log.xml -XX:+AlwaysPreTouch", tmp_path)
    assert got == f"-Xmx1g -Dlog4j.configurationFile={tmp_path / 'conf' / 'log.xml'} -XX:+AlwaysPreTouch"
    assert absolute_log_config("-Xmx1g", tmp_path) == "-Xmx1g"


def test_a_missing_log4j2_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="vmargs: log4j2 configuration .*nope.xml not found"):
        absolute_log_config("-Dlog4j.configurationFile=nope.xml", tmp_path)


def test_a_zero_batch_delay_is_refused():
    # TorchServe 0.12 reads maxBatchDelay 0 as unset and waits 100 ms for every partial batch.
    with pytest.raises(ConfigError, match="max_batch_delay_ms must be >= 1"):
        ModelSettings(batch_size=4, max_batch_delay_ms=0)
    assert ModelSettings(batch_size=4, max_batch_delay_ms=1).max_batch_delay_ms == 1


@pytest.mark.parametrize("command, shell", [
    (StartCommand.LAUNCHER, "torchserve --start --model-store model_store --ts-config config.properties --ncs"),
    (StartCommand.TS_CONFIG, "torchserve --start --model-store model_store --ts-config config.properties"),
    (StartCommand.PLAIN, "torchserve --start --model-store model_store"),
    (StartCommand.PLAIN_NCS, "torchserve --start --model-store model_store --ncs"),
])
def test_start_commands_are_the_ones_users_type(command, shell):
    assert command.shell() == shell


def test_the_launchers_own_command_names_absolute_paths(tmp_path):
    args = StartCommand.LAUNCHER.args(tmp_path / "store", tmp_path / "config.properties")
    assert args == ("--model-store", str(tmp_path / "store"),
                    "--ts-config", str(tmp_path / "config.properties"), "--ncs")


def test_the_serving_python_defaults_to_this_one_and_its_torchserve_sits_beside_it(tmp_path):
    assert LaunchSpec(model_store=tmp_path).torchserve() == Path(sys.executable).parent / "torchserve"
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # as venv makes it
    ts = TorchServe(tmp_path, python=venv_python)
    # The link itself, not what it points at: the venv's packages are found through it.
    assert ts.spec.python == venv_python and ts.spec.torchserve() == tmp_path / "venv" / "bin" / "torchserve"
