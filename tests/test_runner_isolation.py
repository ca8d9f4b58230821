"""On a runner (`pytest -n ...`), a kernel that hangs and a kernel that faults (an illegal
memory access on a GPU, a segmentation fault through the CPU interpreter) each cost their
own test; the tests after them pass. Run as a nested pytest session in a subprocess."""

import re
import textwrap
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.starts_first  # each waits out a timeout: never the tail of a run

LATER_TESTS = 4
SESSION = textwrap.dedent(f'''
    import pytest
    from fmha.regressions.selection import resolve_kernel
    from fmha.regressions.trap import check_case
    from fmha.regressions.traps import TRAPS

    def test_0_bad_kernel(device, request):
        mutant, trap = request.config.getoption("--bad-kernel").split("@")
        check_case(resolve_kernel(mutant), TRAPS[trap].cases[0], device)

    @pytest.mark.parametrize("n", range({LATER_TESTS}))
    def test_1_later_test(device, n):
        assert not check_case(resolve_kernel("fmha"), TRAPS["missing-scale"].cases[0], device)
''')
CONFTEST = textwrap.dedent('''
    import pytest

    def pytest_addoption(parser):
        parser.addoption("--bad-kernel")
        parser.addoption("--bad-kernel-timeout", type=float)

    def pytest_collection_modifyitems(config, items):
        for item in items:
            if item.name == "test_0_bad_kernel" and config.getoption("--bad-kernel-timeout"):
                item.add_marker(pytest.mark.timeout(config.getoption("--bad-kernel-timeout")))
''')
HANG = "mutant:warp-collective-tmem-hang@warp-collective-tmem"
FAULT = "mutant:illegal-memory-access@illegal-memory-access"
TIMEOUT_S = {"cpu": 8, "cuda": 30}  # per test of the session: a cold compile fits, the hang costs no more
# The hang itself: its kernel compiles in 0.1 s (H200, cold), so it needs no room for a compile.
HANG_TIMEOUT_S = {"cpu": 8, "cuda": 15}


def _session(pytester, device, bad_kernel, *args):
    pytester.makepyfile(test_session=SESSION)
    pytester.makeconftest(CONFTEST)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rf", f"--fmha-device={device}", f"--bad-kernel={bad_kernel}",
        f"--timeout={TIMEOUT_S[device]}", "--timeout-method=thread", *args)


def _failed_tests(output: str) -> set[str]:
    return set(re.findall(r"^FAILED (\S+)", output, re.M))


@pytest.mark.parametrize("bad_kernel", [pytest.param(HANG, id="hang"), pytest.param(FAULT, id="memory-fault")])
def test_a_bad_kernel_fails_alone_and_later_tests_pass(pytester, device, bad_kernel):
    hang_timeout = [f"--bad-kernel-timeout={HANG_TIMEOUT_S[device]}"] if bad_kernel == HANG else []
    result = _session(pytester, device, bad_kernel, "-n", "2", *hang_timeout)
    output = result.stdout.str()
    assert _failed_tests(output) == {"test_session.py::test_0_bad_kernel"}, output[-4000:]
    assert result.parseoutcomes().get("passed") == LATER_TESTS, output[-4000:]
    assert "crashed while running 'test_session.py::test_0_bad_kernel'" in output or "Timeout" in output, output[-4000:]


@pytest.mark.gpu
def test_without_xdist_a_poisoned_context_stops_the_session_with_the_reason(pytester, device):
    result = _session(pytester, device, FAULT)
    output = result.stdout.str()
    assert _failed_tests(output) == {"test_session.py::test_0_bad_kernel"}, output[-4000:]
    assert "CUDA context poisoned by test_session.py::test_0_bad_kernel" in output, output[-4000:]


CRASHING_SESSION = textwrap.dedent('''
    import os
    import signal
    import sys

    def test_dies():
        print("the last words through sys.stderr", file=sys.stderr, flush=True)
        os.write(2, b"the last words through file descriptor 2\\n")
        os.kill(os.getpid(), signal.SIGSEGV)

    def test_lives():
        pass
''')


HANGING_SESSION = textwrap.dedent('''
    import sys
    import time

    def wait_for_ever():
        while True:
            time.sleep(0.05)

    def test_hangs():
        print("the last words before the hang", file=sys.stderr, flush=True)
        wait_for_ever()

    def test_lives():
        pass
''')


@pytest.mark.cpu_tier
def test_a_hung_test_that_pytest_timeout_ends_leaves_where_it_hung_and_its_stderr(pytester):
    """pytest-timeout's thread method ends the worker with exit status 1 after emptying the captured
    stderr, and writes the stacks where xdist does not look: the report still says where the test
    hung and what it wrote."""
    pytester.makepyfile(test_session=HANGING_SESSION)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--timeout", "3",
                                           "--timeout-method", "thread")
    output = result.stdout.str()
    assert result.parseoutcomes().get("passed") == 1 and _failed_tests(output) == {"test_session.py::test_hangs"}, output
    for said in ("crashed while running 'test_session.py::test_hangs'", "exit status 1",
                 "pytest-timeout ends test_session.py::test_hangs at 3 s", "in wait_for_ever",
                 "the last words before the hang"):
        assert said in output, f"the terminal does not say {said!r}:\n{output[-3000:]}"


@pytest.mark.cpu_tier  # a worker's death is reported alike whatever the device
def test_a_worker_that_dies_leaves_its_signal_test_and_stderr_in_the_summary_and_the_junit_xml(pytester):
    pytester.makepyfile(test_session=CRASHING_SESSION)
    report = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", f"--junitxml={report}")
    output = result.stdout.str()
    assert result.parseoutcomes().get("passed") == 1 and _failed_tests(output) == {"test_session.py::test_dies"}, output
    case = ET.parse(report).getroot().find(".//testcase[@name='test_dies']")
    junit = "".join(text for failed in case if failed.tag in ("failure", "error")
                    for text in (failed.get("message", ""), *failed.itertext()))
    for where, text in (("the terminal", output), ("the JUnit XML", junit)):
        for said in ("crashed while running 'test_session.py::test_dies'", "killed by SIGSEGV",
                     "Fatal Python error: Segmentation fault", "in test_dies",
                     "the last words through sys.stderr", "the last words through file descriptor 2"):
            assert said in text, f"{where} does not say {said!r}:\n{text[-3000:]}"
