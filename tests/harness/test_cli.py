"""`python -m harness VERB`: the usage, every verb's --help, `list` with descriptions, bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.__main__ import VERBS, main
from harness.run.config import describe_choice, group_choices

GROUPS = ("exp", "method", "model", "gpu", "launcher")


def test_help_prints_usage_description_and_every_verb_to_stdout(capsys):
    assert main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: python -m harness VERB [ARGS]") and not err
    assert "FORGE benchmark harness" in out
    for name, verb in VERBS.items():
        assert f"  {name}" in out and verb.summary in out


def test_help_as_the_shell_runs_it():
    done = subprocess.run([sys.executable, "-m", "harness", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m harness")


def test_no_verb_or_an_unknown_one_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "usage: python -m harness" in capsys.readouterr().err
    assert main(["bogus"]) == 2
    assert "unknown verb 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["sweep", "run", "list"])
def test_the_verbs_that_take_overrides_answer_help_before_hydra(verb, capsys):
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m harness {verb}") and "examples:" in out
    assert main([verb, "+exp=smoke", "-h"]) == 0  # anywhere on the line
    assert main(["help", verb]) == 0
    assert capsys.readouterr().out == out * 2


@pytest.mark.parametrize("verb", ["report", "regress", "data", "kernels"])
def test_the_other_verbs_hand_help_to_their_parser(verb, capsys):
    with pytest.raises(SystemExit) as e:
        main([verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m harness {verb}")
    assert "examples" in out


def test_every_verb_has_help():
    for name, verb in VERBS.items():
        assert verb.summary and (verb.help is not None or name in ("report", "regress", "kernels", "data"))


def test_list_says_what_each_entry_is(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for group in GROUPS:
        for name in group_choices(group):
            assert f"  {name}" in out and describe_choice(group, name) in out
    assert "method implementations" in out and "forge.attach" in out


def test_list_one_group(capsys):
    assert main(["list", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "tiny-llama" not in out
    assert main(["list", "bogus"]) == 2


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"conf-{g}")  # an id "gpu" marks a GPU test
def test_every_config_file_opens_with_a_one_line_description(group):
    for name in group_choices(group):
        text = describe_choice(group, name)
        assert not text.startswith("(no description"), f"conf/{group}/{name}.yaml"
        assert text.endswith(".") and len(text) <= 100, f"conf/{group}/{name}.yaml: {text!r}"


def test_a_bad_override_is_a_config_error(capsys):
    assert main(["sweep", "+exp=smoke", "batch_size=0"]) == 2
    assert "config error: batch_size=0 must be positive" in capsys.readouterr().err
