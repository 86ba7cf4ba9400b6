"""The in-process ``hfai`` of tests/hfai_cli.py answers as the real process would and leaves the
test's process as it found it."""

from __future__ import annotations

import logging
import os
import signal

import click
import hfai_cli


def test_it_answers_as_a_process_does():
    r = hfai_cli.run(["submit", "-p", "urgent", "bash", "-c", "true"])
    assert r.returncode == 2 and r.stdout == "" and "Usage: hfai submit" in r.stderr
    assert "unknown priority 'urgent'" in r.stderr and "Traceback" not in r.stderr
    assert hfai_cli.run(["--help"]).stdout.startswith("Usage: hfai [OPTIONS] COMMAND")


def test_an_escaping_exception_is_a_traceback_on_stderr(monkeypatch):
    @click.command()
    def broken():
        raise RuntimeError("a bug")

    monkeypatch.setattr("hfai.cli.main.main", broken)
    r = hfai_cli.run([])
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr and "RuntimeError: a bug" in r.stderr


def test_a_command_that_would_replace_the_process_is_refused():
    # `hfai python` without `--` execs python in place of hfai: here that would be pytest.
    r = hfai_cli.run(["python", "-c", "pass"])
    assert r.returncode == 1 and "run it as a subprocess" in r.stderr
    assert os.execv.__module__ == "posix"


def test_a_call_leaves_the_process_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("HFAI_KEPT", "before")
    seen = {}

    @click.command()
    def meddler():
        seen["cwd"], seen["kept"] = os.getcwd(), os.environ.get("HFAI_KEPT")
        os.environ["HFAI_LEFT_BEHIND"] = "1"
        os.chdir("/")
        logging.getLogger().addHandler(logging.NullHandler())
        logging.getLogger().setLevel(logging.DEBUG)
        signal.signal(signal.SIGTERM, lambda *_: None)

    monkeypatch.setattr("hfai.cli.main.main", meddler)
    cwd, handlers, level = os.getcwd(), list(logging.getLogger().handlers), logging.getLogger().level
    term = signal.getsignal(signal.SIGTERM)
    r = hfai_cli.run([], env={"HFAI_KEPT": "during"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert seen == {"cwd": str(tmp_path), "kept": "during"}
    assert os.getcwd() == cwd and os.environ["HFAI_KEPT"] == "before" and "HFAI_LEFT_BEHIND" not in os.environ
    assert logging.getLogger().handlers == handlers and logging.getLogger().level == level
    assert signal.getsignal(signal.SIGTERM) is term
