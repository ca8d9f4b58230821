"""Progress where it is read: piped output (a CI log) of `pytest -n N` and of
`python -m fmha.ci.verify` gets a line every few seconds, saying how far the run is, what
failed and what is running, where pytest's dots would wait for a full row and tqdm draws nothing."""

import textwrap

import pytest

from fmha.ci import progress, verify

pytest_plugins = ["pytester"]

SLOW = textwrap.dedent("""
    import time

    def test_slow():
        time.sleep(2)

    def test_fails():
        assert False
""")


@pytest.mark.starts_first  # a nested two-worker session: 15 s on an H200
def test_a_distributed_session_piped_says_what_is_running(pytester):
    pytester.makepyfile(test_slow=SLOW)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "--fmha-progress", "0.5")
    lines = [line for line in result.outlines if line.startswith("fmha: ") and " done in " in line]
    assert lines, result.stdout.str()[-2000:]
    assert any("/2 done in" in line and "1 failed" in line and "running test_slow.py::test_slow (" in line
               for line in lines), lines
    # in place of the dots: a failure's F still marks it, no row of dots waits to fill
    marks = [line for line in result.outlines if line.strip() and set(line.split("[")[0].strip()) <= set(".sF")]
    assert marks and all("." not in line.split("[")[0] for line in marks), result.stdout.str()[-2000:]


def test_verify_piped_writes_a_line_every_few_seconds(monkeypatch, capsys):
    monkeypatch.setattr(progress, "EVERY_S", 0.05)
    verify.main(["--fmha-kernel", "sdpa-math", "--fmha-device", "cpu", "--law-examples", "0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fmha verify: ")]
    assert len(lines) >= 2 and " done in " in lines[-1] and "; now sdpa-math " in lines[-1], lines


def test_the_nightly_gate_piped_writes_a_line_every_few_seconds(monkeypatch, capsys):
    from fmha.ci import nightly
    from fmha.properties.grid import GRID
    from fmha.registry import KERNELS

    monkeypatch.setattr(progress, "EVERY_S", 0.05)
    configs = [c for c in GRID if (c.head_dim, c.q_len) == (64, 1)]
    nightly.run_gate([KERNELS["sdpa-math"]], "cpu", 1, nightly.cases(configs, []))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fmha nightly: ")]
    assert len(lines) >= 2 and " runs in " in lines[-1] and "last sdpa-math hd64" in lines[-1], lines


def test_a_test_whose_worker_died_is_counted_failed_and_done_not_left_running():
    """xdist reports a test whose worker died (its `when` is "???") and no end follows: on an H100
    the line said "0 failed" and named that test as running until the run ended."""
    from types import SimpleNamespace

    from _pytest.reports import TestReport

    line = progress.PytestProgress(SimpleNamespace(get_terminal_writer=lambda: None), every=0)
    line.total = 2
    for nodeid in ("test_x.py::test_dies", "test_x.py::test_lives"):
        line.pytest_runtest_logstart(nodeid, None)
    line.pytest_runtest_logreport(TestReport("test_x.py::test_dies", ("test_x.py", 1, "test_dies"), {}, "failed",
                                             "worker 'gw0' crashed while running 'test_x.py::test_dies'", "???"))
    said = line.line()
    assert "1/2 done" in said and "1 failed" in said and "test_dies" not in said and "test_lives" in said, said
