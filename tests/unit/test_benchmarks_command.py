"""`python -m benchmarks <verb>`: one command for every measuring tool. Every verb's --help works; an
unknown verb or option is refused with the fix named; a shared option parses the same under every verb."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from benchmarks.__main__ import VERBS, main
from benchmarks.load import cli

pytestmark = pytest.mark.unit

# A verb whose module keeps its own argparse (benchmarks/bench/export_variants.py), registered as it is: its
# --help works, its refusals are argparse's own.
OWN_ARGPARSE = {"variants"}
# Modules others keep with their own argparse, registered as they are (their verbs' --help still works).
OWN_PARSERS = ("export_variants.py",)
# Flags a verb declares with another meaning than the shared option's: the tuner's space of worker counts.
OWN_MEANING = {("tune", "--workers"), ("tune-ray", "--workers")}


def verb_parser(verb: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser a verb's main builds, caught at parse_args (nothing runs)."""
    built = []

    def caught(self, args=None, namespace=None):
        built.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    with pytest.raises(SystemExit):
        importlib.import_module(VERBS[verb][0]).main([])
    monkeypatch.undo()
    return built[0]


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_answers_help(verb, capsys):
    with pytest.raises(SystemExit) as done:
        main([verb, "--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_no_verb_lists_them_all(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(verb in out for verb in VERBS)


def test_a_verb_that_cannot_measure_ends_in_one_line_and_status_2(monkeypatch, capsys):
    from benchmarks.bench import served
    from benchmarks.load.errors import BenchmarkError
    from serving.errors import LauncherError

    assert not issubclass(BenchmarkError, LauncherError)  # the benchmarks' family is their own

    def refuses(argv):
        raise BenchmarkError("no archive to measure: run make build")

    monkeypatch.setattr(served, "main", refuses)
    assert main(["bench"]) == 2
    assert capsys.readouterr().err == "error [bench]: no archive to measure: run make build\n"


def test_an_unknown_verb_is_refused_naming_the_closest(capsys):
    assert main(["tuen", "--model", "minilm"]) == 2
    err = capsys.readouterr().err
    assert "unknown verb 'tuen'" in err and "did you mean 'tune'?" in err and "bench" in err


@pytest.mark.parametrize("verb", sorted(set(VERBS) - OWN_ARGPARSE))
def test_an_unknown_option_is_refused_naming_the_closest_and_the_help(verb, capsys):
    with pytest.raises(SystemExit) as done:
        main([verb, "--model", "minilm", "--model-stroe", "x"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert f"python -m benchmarks {verb}" in err and "--model-stroe" in err and f"{verb} --help" in err


def test_a_misspelt_option_gets_its_fix(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--model", "minilm", "--wait-quite", "60"])
    assert "did you mean --wait-quiet?" in capsys.readouterr().err


@pytest.mark.parametrize("verb", sorted(set(VERBS) - OWN_ARGPARSE))
def test_shared_options_parse_the_same_under_every_verb(verb, monkeypatch):
    parser = verb_parser(verb, monkeypatch)
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    shared = {o.flag: o for o in cli.OPTIONS.values() if o.flag in actions and (verb, o.flag) not in OWN_MEANING}
    assert "--model" in shared or "--model-store" in shared, f"{verb} takes no model"
    for flag, option in shared.items():
        action = actions[flag]
        parsed = action.type(_sample(option)) if action.type else _sample(option)
        expected = option.type(_sample(option)) if option.type else _sample(option)
        if option.action is None and action.nargs is None:
            assert parsed == expected, f"{verb} {flag} parses {_sample(option)!r} as {parsed!r}"
        assert action.choices in (None, option.choices) or flag == "--model", f"{verb} {flag}: other choices"
        if option.type is Path:
            assert action.type is Path, f"{verb} {flag} is not a path"
        if option.default is not None:
            assert action.default is not None, f"{verb} {flag} lost its default {option.default!r}"


def _sample(option: cli.Option) -> str:
    if option.choices:
        return option.choices[0]
    return {int: "3", float: "2.5", None: "x", Path: "x"}.get(option.type, "3")  # else numbers(): "3" -> (3,)


def test_a_shared_option_is_declared_once():
    """No verb declares a shared option by hand: each comes from cli.OPTIONS (cli.add)."""
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    flags = {o.flag for o in cli.OPTIONS.values()}
    own = {f"tune/command.py: {flag}" for verb, flag in OWN_MEANING}
    by_hand = [f"{path.relative_to(root)}: {flag}" for path in root.rglob("*.py")
               if path.name not in (*OWN_PARSERS, "cli.py")
               for flag in flags if f'add_argument("{flag}"' in path.read_text(encoding="utf-8")]
    by_hand = [place for place in by_hand if place not in own]
    assert by_hand == [], "declare these through benchmarks/load/cli.py's OPTIONS"


def test_an_unknown_shared_option_names_where_to_declare_it():
    with pytest.raises(KeyError, match="benchmarks/load/cli.py"):
        cli.add(argparse.ArgumentParser(), "no_such_option")


def test_report_folders_and_tables_have_one_shape(tmp_path):
    folder = cli.report_folder(tmp_path, "tune", "minilm", when="20260101-000000")
    assert folder == tmp_path / "tune-minilm-20260101-000000"
    assert cli.table(("a", "b"), [(1, None), ("x", 2.5)]) == ["| a | b |", "|---|---|", "| 1 | |", "| x | 2.5 |"]


def test_a_reports_command_names_paths_inside_the_repository_relative_to_it():
    from benchmarks.load.cli import command_line
    from serving.repo import REPO_ROOT

    out = REPO_ROOT / "benchmarks" / "reports" / "x"
    assert command_line("bench", ["--out", str(out), f"--model-store={REPO_ROOT / 'model_store'}", "/elsewhere/a"]) == (
        ".venv/bin/python -m benchmarks bench --out benchmarks/reports/x --model-store=model_store /elsewhere/a")
