"""`python -m fmha.ci.verify`, the README's main job, on a kernel that raises on some cases:
the run completes the table, marks those cases with the error, groups identical findings,
prints the kernel's skip reasons, writes --json and exits 1."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fmha.ci.run_record import RunRecord
from fmha.oracles.distributions import DISTRIBUTIONS
from fmha.properties.feature_cases import FEATURE_CASES

pytestmark = pytest.mark.cpu_tier  # verify on the CPU (--fmha-device cpu): a CUDA session runs it with --fmha-nightly

RAISING = textwrap.dedent('''
    from fmha.registry import KERNELS

    _math = KERNELS["sdpa-math"]

    def fwd(q, k, v, **kwargs):
        if q.shape[-1] == 256:
            raise RuntimeError("no kernel for head dim 256 yet")
        return _math(q, k, v, **kwargs)

    fwd.capabilities = _math.capabilities  # no sink, no lse, no out: skips with SDPA's reasons
''')


@pytest.mark.starts_first  # runs the whole verify job in a subprocess
def test_a_kernel_that_raises_costs_its_cases_and_the_run_goes_on(tmp_path):
    (tmp_path / "raising_kernels.py").write_text(RAISING)
    report = tmp_path / "verify.json"
    run = subprocess.run([sys.executable, "-m", "fmha.ci.verify", "--fmha-kernel", "raising_kernels:fwd",
                          "--fmha-device", "cpu", "--law-examples", "1", "--json", str(report)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "CI": "true"})
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(report.read_text())["results"]
    assert {RunRecord.from_json(r).part for r in results} == {"agreement", "named cases", "laws"}  # the gate's record too
    agreement = [r for r in results if r["part"] == "agreement"]
    assert len(agreement) == len(FEATURE_CASES) * 3 * len(DISTRIBUTIONS)  # every feature case x dtype x distribution has a row
    raised = {r["what"] for r in agreement if r["outcome"] == "raised"}
    assert raised and all(what.startswith("hd256-") for what in raised), sorted(raised)[:5]
    assert {r["outcome"] for r in agreement if not r["what"].startswith("hd256-")} <= {"passed", "skipped"}
    assert all("RuntimeError: no kernel for head dim 256 yet" in r["message"] for r in agreement
               if r["outcome"] == "raised")
    out = run.stdout
    # one finding for all of them, not one per case
    assert out.count(f"agreement: {len(raised)} case(s) raised") == 1, out[-3000:]
    # the to-do list: each missing capability once per kernel, with what it keeps from running
    assert "## To do: what each kernel cannot run, and why" in out
    assert len([line for line in out.splitlines() if line.startswith("- raising_kernels:fwd: no sink support")]) == 1
    assert {r["part"] for r in results} == {"agreement", "named cases", "laws"}
    # last, the command that reruns each failure alone; one of them, run as printed
    reruns = [line.split("    #")[0] for line in out.splitlines()
              if line.startswith("python -m fmha.ci.verify ") and "# agreement raised" in line]
    assert len(reruns) == 1 and f"(and {len(raised) - 1} more like it)" in out, out[-2000:]  # one finding, one line
    ran = sum(r["outcome"] != "skipped" for r in agreement)
    assert f"Agreement: {ran} of {len(agreement)} ran" in out, out[:800]  # the header says what ran
    again = subprocess.run([sys.executable, *reruns[0].split()[1:], "--json", str(report)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600, env={**os.environ, "CI": "true"})
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    (only,) = json.loads(report.read_text())["results"]
    assert only["outcome"] == "raised" and reruns[0].endswith(f"--only {only['what']}"), (only, reruns[0])


def test_the_rest_of_a_run_goes_on_in_a_fresh_process():
    """What verify does after a case leaves the CUDA context unusable: the items after it run
    in a fresh process and their results join the report (here on the CPU, from item 1)."""
    from fmha.ci import verify
    from fmha.properties.feature_cases import FEATURE_CASES, with_dtypes

    first, second = (s.id for s in with_dtypes(FEATURE_CASES)[:2])
    argv = ["--fmha-kernel", "sdpa-math", "--fmha-device", "cpu", "--law-examples", "0", "--only", first,
            "--only", second]
    rest = verify._rest_in_a_fresh_process(argv, 1, seed=7)
    assert [(r.what, r.outcome) for r in rest] == [(second, "passed")], rest


def test_the_to_do_list_gives_each_missing_capability_one_line():
    from fmha.ci.verify import to_do

    skipped = [RunRecord("k", "agreement", f"case{i}", "bf16", "skipped", f"Hq={h} unsupported (supports [64]); no sink")
               for i, h in enumerate((2, 4, 4))]
    skipped.append(RunRecord("k", "named cases", "some-trap/case", "bf16", "skipped", "no sink"))
    assert to_do(skipped) == ["- k: no sink: 3 agreement, 1 named cases (some-trap)",
                              "- k: Hq=4 unsupported (supports [64]) (and 1 more like it): 3 agreement"]


def test_the_header_describes_what_ran(capsys):
    """With --only, the header names the one case that ran, not the whole agreement set."""
    from fmha.ci import verify
    from fmha.properties.feature_cases import FEATURE_CASES, with_dtypes

    first = with_dtypes(FEATURE_CASES)[0].id
    assert verify.main(["--fmha-kernel", "sdpa-math", "--fmha-device", "cpu", "--law-examples", "0",
                        "--only", first, "--fmha-seed", "7"]) == 0
    header = capsys.readouterr().out.split("|")[0]
    assert f"Agreement: 1 of 1 ran. Only {first}. Values drawn at seed 7" in header, header
