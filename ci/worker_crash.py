"""Why an xdist worker died: when a worker's process ends in the middle of a test (a kernel's
segfault, an abort inside CUDA's runtime, pytest-timeout ending a hung test, the out-of-memory
killer), the test it ran fails with the signal or exit status, the fatal error's traceback, and
the last lines the worker wrote to stderr, in the terminal summary and the JUnit XML. xdist alone
says only "worker 'gw3' crashed while running ...": on a GPU runner twelve workers once went down
so, and nothing said why.

Each worker writes its files into a directory the controller makes for the session:
- `<worker>.fatal`: faulthandler's traceback of every thread on a fatal signal;
- `<worker>.stderr`: what the worker writes to file descriptor 2 while pytest captures it (a test's
  output, C++ and CUDA messages): pytest's capture file for stderr, which it empties after each
  test and which would die with the process, is made this named file;
- `<worker>.hung` and `<worker>.hung-stderr`: half a second before pytest-timeout's thread method
  ends a hung test with os._exit(1), the test's stack and its stderr so far. pytest-timeout reads
  (and so empties) the captured stderr and writes the stacks to the worker's terminal, which xdist
  does not forward: a GPU run's hung law once said only "exit status 1".
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback

import pytest

DIRECTORY_INPUT = "fmha_worker_files"  # the directory, as each worker gets it
DIRECTORY = pytest.StashKey[str]()
FATAL = pytest.StashKey[object]()  # the worker's open faulthandler file
FILES = pytest.StashKey[str]()  # a worker's: its files' path, less the suffix
HANG_TIMER = pytest.StashKey[threading.Timer]()
HANG_NOTICE_S = 0.5  # how long before pytest-timeout ends a test its stack is written
HEAD_LINES = 12  # of faulthandler's report: the signal, then the crashing thread's innermost frames
TAIL_LINES = 30  # of stderr


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin points it at stderr
def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        if getattr(config.option, "numprocesses", None):  # an xdist controller
            config.stash[DIRECTORY] = tempfile.mkdtemp(prefix="fmha-workers-")
        return
    directory = workerinput.get(DIRECTORY_INPUT)
    if directory is None:
        return
    worker = workerinput["workerid"]
    config.stash[FILES] = os.path.join(directory, worker)
    config.stash[FATAL] = open(f"{config.stash[FILES]}.fatal", "w")
    config.add_cleanup(config.stash[FATAL].close)
    faulthandler.enable(file=config.stash[FATAL], all_threads=True)
    _keep_captured_stderr(config, f"{config.stash[FILES]}.stderr")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """Beside pytest-timeout's own timer (this returns None, so it still sets it): with its thread
    method, what the test was doing just before the end, in the worker's files."""
    files = item.config.stash.get(FILES, None)
    if files is None or settings.method != "thread" or not settings.timeout:
        return None
    timer = threading.Timer(max(settings.timeout - HANG_NOTICE_S, 0.0), _write_hang,
                            (files, item.nodeid, settings.timeout, threading.get_ident()))
    timer.daemon = True
    timer.start()
    item.stash[HANG_TIMER] = timer
    return None


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_cancel_timer(item):
    timer = item.stash.get(HANG_TIMER, None)
    if timer is not None:
        timer.cancel()
        files = item.config.stash[FILES]
        for stale in (f"{files}.hung", f"{files}.hung-stderr"):  # the test ended in time after all
            if os.path.exists(stale):
                os.remove(stale)
    return None


def _write_hang(files: str, nodeid: str, timeout: float, thread: int) -> None:
    """The test's stack, innermost first (faulthandler's order), and a copy of its stderr so far."""
    frame = sys._current_frames().get(thread)
    stack = reversed(traceback.extract_stack(frame)) if frame is not None else ()
    with open(f"{files}.hung", "w") as f:
        f.write(f"Timeout: pytest-timeout ends {nodeid} at {timeout:g} s; it was here (most recent call first):\n")
        f.writelines(f'  File "{s.filename}", line {s.lineno} in {s.name}\n' for s in stack)
    if os.path.exists(f"{files}.stderr"):  # not with -s or --capture=sys: the terminal has it
        shutil.copyfile(f"{files}.stderr", f"{files}.hung-stderr")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    directory = node.config.stash.get(DIRECTORY, None)
    if directory is not None:
        node.workerinput[DIRECTORY_INPUT] = directory


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    directory = report.node.config.stash.get(DIRECTORY, None)
    if directory is not None:
        report.longrepr = f"{report.longrepr}: {why_it_died(report.node, directory)}"


def pytest_unconfigure(config):
    directory = config.stash.get(DIRECTORY, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _keep_captured_stderr(config, path: str) -> None:
    """Point pytest's capture file for stderr (file descriptor N, which fd 2 is a copy of while a
    test runs) at `path`: the same reads, writes and truncations, on a file that outlives the
    process. Only with fd capture (pytest's default); with -s or --capture=sys fd 2 is the worker's
    stderr, which the controller shows as it comes."""
    capture = getattr(config.pluginmanager.getplugin("capturemanager"), "_global_capturing", None)
    err = getattr(capture, "err", None)
    tmpfile = getattr(err, "tmpfile", None)
    if tmpfile is None or not hasattr(err, "targetfd_save"):  # not an FDCapture
        return
    captured = tmpfile.fileno()
    now_captured = os.path.sameopenfile(2, captured)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, captured)
    if now_captured:
        os.dup2(fd, 2)
    os.close(fd)


def exit_status(node) -> int | None:
    """The worker process's exit status (negative: the signal that ended it), once it has ended."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return None
    try:
        return popen.wait(timeout=10)
    except Exception:  # noqa: BLE001 -- still running, or not ours to wait for: say nothing of it
        return None


def why_it_died(node, directory: str) -> str:
    """The worker's end: its signal or exit status, then faulthandler's report and the last lines
    of its stderr, where there are any."""
    worker = node.gateway.id
    status = exit_status(node)
    if status is None:
        said = "its exit status is not known"
    elif status < 0:
        said = f"killed by {signal.Signals(-status).name} (signal {-status})"
    else:
        said = f"exit status {status}"
    parts = [said]
    files = os.path.join(directory, worker)
    # the error, then the innermost frames; a hang's stack where pytest-timeout ended it (its exit is no signal)
    fatal = (_lines(f"{files}.fatal") or _lines(f"{files}.hung"))[:HEAD_LINES]
    stderr = (_lines(f"{files}.stderr") or _lines(f"{files}.hung-stderr"))[-TAIL_LINES:]
    if fatal:
        parts.append("its fatal error:\n" + "\n".join(fatal))
    if stderr:
        parts.append("the last lines it wrote to stderr:\n" + "\n".join(stderr))
    return "\n".join(parts)


def _lines(path: str) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []
