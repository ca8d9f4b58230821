"""Progress where it is read. On a terminal, pytest's dots and tqdm's bar; on piped output (a CI
log, `| tee`) pytest's dots arrive a row of 72 at a time, a row of slow tests can take minutes,
and tqdm draws nothing. There, a line every few seconds (`pytest -n N`: `--fmha-progress
SECONDS`, default 10, 0 for none) says how far the run is and what is running, in place of the
dots (an F or E still marks a failure as it comes):

    fmha: 812/3276 done in 2m10s, 1 failed; running properties/test_laws.py::test_x[fmha] (45 s), ...
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

import pytest

EVERY_S = 10.0


def elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Ticker:
    """Writes `line()` every `every` seconds from a daemon thread, while in its `with` block."""

    def __init__(self, every: float, line: Callable[[], str], write: Callable[[str], None]):
        self.every, self.line, self.write = every, line, write
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fmha-progress", daemon=True)

    def _run(self):
        while not self._stop.wait(self.every):
            self.write(self.line())

    def __enter__(self):
        if self.every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()


class PytestProgress:
    """The session's progress line, written by the xdist controller (which runs no test itself)."""

    def __init__(self, config, every: float):
        self.terminal = config.get_terminal_writer()
        self.total = self.done = self.failed = 0
        self.running: dict[str, float] = {}
        self.start = time.monotonic()
        self.ticker = Ticker(every, self.line, self._write)

    def line(self) -> str:
        now = time.monotonic()
        if not self.total:
            return f"fmha: collecting, {elapsed(now - self.start)}"
        longest = sorted(dict(self.running).items(), key=lambda item: item[1])  # a copy: tests end meanwhile
        running = ", ".join(f"{nodeid} ({now - started:.0f} s)" for nodeid, started in longest[:2])
        more = f" and {len(longest) - 2} more" if len(longest) > 2 else ""
        return (f"fmha: {self.done}/{self.total} done in {elapsed(now - self.start)}, {self.failed} failed"
                + (f"; running {running}{more}" if running else ""))

    def _write(self, text: str) -> None:
        if self.terminal.width_of_current_line:  # inside a row of dots
            self.terminal.line()
        self.terminal.line(text)
        self.terminal.flush()

    def pytest_collection_finish(self, session):
        self.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.total = len(ids)

    def pytest_runtest_logstart(self, nodeid, location):
        self.running[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        crashed = report.when == "???"  # xdist's report of a test whose worker died: no logfinish follows
        self.failed += report.failed and (report.when in ("setup", "call") or crashed)
        if crashed and self.running.pop(report.nodeid, None) is not None:
            self.done += 1

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        """No dot or s for a test that passed or skipped: the progress line says how many ran."""
        if hasattr(report, "wasxfail") or report.failed:
            return None
        if report.when == "call" and report.passed:
            return "passed", "", "PASSED"
        if report.skipped:
            return "skipped", "", "SKIPPED"
        return None

    def pytest_runtest_logfinish(self, nodeid, location):
        self.running.pop(nodeid, None)
        self.done += 1

    def pytest_sessionfinish(self, session):
        self.ticker.__exit__()


def install(config) -> None:
    """At the session's start: the progress line where the output is piped (or where
    --fmha-progress asks)."""
    every = config.getoption("--fmha-progress")
    if every is None:
        every = 0.0 if sys.stdout.isatty() else EVERY_S
    # Only where the tests run in xdist workers: in a process that runs them, a line written
    # during a test would land in the test's captured output.
    distributed = getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")
    if every > 0 and distributed and config.pluginmanager.has_plugin("terminalreporter"):
        progress = PytestProgress(config, every)
        config.pluginmanager.register(progress, "fmha-progress")
        progress.ticker.__enter__()
