"""Prints the wall time each test file took (setup, call and teardown of its tests), slowest
first, at the end of a run: the CI budget is spent per file, so that is the unit to watch."""

from __future__ import annotations

import collections

import pytest

# File path -> seconds; bounded by the number of test files collected.
_seconds_by_file: collections.Counter[str] = collections.Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_by_file[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds_by_file:
        return
    terminalreporter.section("seconds per test file")
    for path, seconds in _seconds_by_file.most_common():
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(f"{sum(_seconds_by_file.values()):8.1f}  in all")
