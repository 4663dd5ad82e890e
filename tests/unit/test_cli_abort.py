"""How a command that stops before its end exits: a confirmation answered no is 1, "aborted:
nothing sent" (it was 130, an interrupt's code); a Ctrl-C is 130, "interrupted" (click turns
it into the same Abort; it said "nothing sent" of a batch it cut short)."""

from __future__ import annotations

import io

import click
import pytest

from runstream.engine.cli.errors import run_cli


@click.group()
def group() -> None:
    pass


@group.command()
def ask() -> None:
    click.confirm("go on?", abort=True)


@group.command()
def cut() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("command", "code", "said"), [
    ("ask", 1, "aborted: nothing sent"), ("cut", 130, "interrupted")])
def test_a_command_stopped_early_says_how(command: str, code: int, said: str,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["runstream", command])
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    with pytest.raises(SystemExit) as ended:
        run_cli(group)
    assert ended.value.code == code
    assert capsys.readouterr().err.strip().endswith(said)
