"""What a fault costs the nightly gate (`python -m fmha.ci.nightly` on the CPU slice): a kernel that
hangs or kills its process on one config costs that run; a shard killed mid-run keeps every run
it finished and the merge names the rest "not run"; two gates never write one report folder at
once; a gated kernel that ran nothing fails the gate."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fmha.ci import journal, nightly
from fmha.ci.run_record import RunRecord

pytestmark = pytest.mark.cpu_tier  # the gate on --fmha-device cpu: its GPU faults in the nightly

# Each fault happens once (a file marks it), on one config of the CPU slice at head dim 64.
FAULTY = textwrap.dedent('''
    import dataclasses
    import os
    import signal
    import time
    from pathlib import Path

    from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, reference

    def fwd(q, k, v, **kwargs):
        config = (q.shape[1], k.shape[1])
        marker = Path(f"faulted-{config[0]}-{config[1]}")
        if config in ((1, 100), (4, 128)) and not marker.exists():
            marker.touch()
            if config == (1, 100):
                time.sleep(10**6)  # hangs
            os.kill(os.getpid(), signal.SIGSEGV)  # dies
        return reference(q, k, v, **kwargs)

    def killing_its_shard(q, k, v, **kwargs):  # its job killed at its fourth call, where asked to
        calls = Path("calls")
        calls.write_text(str(int(calls.read_text()) + 1) if calls.exists() else "1")
        if int(calls.read_text()) == 4 and os.environ.get("KILL_THIS_SHARD"):
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return reference(q, k, v, **kwargs)

    def held(q, k, v, **kwargs):  # its first run waits until the test says "go"
        while not Path("go").exists():
            time.sleep(0.05)
        return reference(q, k, v, **kwargs)

    def fine(q, k, v, **kwargs):
        return reference(q, k, v, **kwargs)

    fwd.capabilities = killing_its_shard.capabilities = held.capabilities = fine.capabilities = REFERENCE

    def paged_only(q, k, v, **kwargs):  # declares paged calls only: the grid has none for it
        return reference(q, k, v, **kwargs)

    paged_only.capabilities = dataclasses.replace(REFERENCE, sources=frozenset({"paged"}))
''')


def _gate(tmp_path, kernels: str, out: str, *args, popen=False, cwd=None, **env):
    command = [sys.executable, "-m", "fmha.ci.nightly", "--fmha-device", "cpu", "--head-dims", "64", "--out",
               str(tmp_path / out), *(f"--fmha-kernel=faulty:{kernel}" for kernel in kernels.split()), *args]
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(tmp_path), **env}
    if popen:  # a session of its own: a kernel that kills its process group kills this gate alone
        return subprocess.Popen(command, cwd=cwd or tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(command, cwd=cwd or tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _records(path) -> list[RunRecord]:
    return [RunRecord.from_json(r) for r in json.loads((path / "results.json").read_text())["records"]]


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """A directory with the kernels above, the current one and importable (for the gates run in
    this process; those run as commands get it as their own)."""
    (tmp_path / "faulty.py").write_text(FAULTY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_hang_and_a_crash_each_cost_one_run_and_the_gate_goes_on(faulty, capsys):
    """And beside them a gated kernel whose every run skips: it fails the gate too."""
    started = time.monotonic()
    status = nightly.main(["--fmha-device", "cpu", "--head-dims", "64", "--fmha-kernel", "faulty:fwd",
                           "--fmha-kernel", "faulty:paged_only", "--out", "report", "--run-timeout", "2"])
    took = time.monotonic() - started
    assert status == 1, capsys.readouterr().out[-3000:]
    records = [r for r in _records(faulty / "report") if r.kernel == "faulty:fwd"]
    faults = {r.where["config"]: r.message for r in records if r.outcome == "raised"}
    assert set(faults) == {"hd64-T1-S100", "hd64-T4-S128"}, faults
    assert faults["hd64-T1-S100"].startswith("hang: no answer within 2 s"), faults
    assert faults["hd64-T4-S128"].startswith("crash: the process running the kernel died (signal SIGSEGV)"), faults
    assert sum(r.outcome == "passed" for r in records) == len(records) - 2
    summary = (faulty / "report" / "summary.md").read_text()
    assert "hd64-T1-S100" in summary and "hang: no answer within 2 s" in summary
    assert "faulty:paged_only: no run returned an answer (36 skipped, 0 raised, 0 not run)" in summary, summary
    assert (faulty / "report" / "index.html").exists()
    assert took < 120, f"the gate took {took:.0f} s with a 2 s bound"


def test_a_shard_killed_mid_run_keeps_its_finished_runs_and_the_merge_names_the_rest_not_run(faulty, capsys):
    (faulty / "shard-1").mkdir()  # an earlier night's report, which the killed one does not replace
    (faulty / "shard-1" / "results.json").write_text(json.dumps(dict(shard=[1, 2], header="# an earlier night",
                                                                     device="CPU", records=[])))
    (faulty / "elsewhere").mkdir()  # the other shard counts its calls apart, side by side
    killed = _gate(faulty, "killing_its_shard", "shard-1", "--shard", "1/2", popen=True, KILL_THIS_SHARD="1")
    other = _gate(faulty, "killing_its_shard", "shard-2", "--shard", "2/2", popen=True, cwd=faulty / "elsewhere")
    killed.wait(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    finished = [e for e in journal.read_journal(faulty / "shard-1" / nightly.RUNS) if "record" in e]
    assert len(finished) == 3, finished  # the fourth call killed the shard
    assert other.wait(timeout=600) == 0, other.stderr.read()[-3000:]
    assert nightly.main(["merge", str(faulty / "shard-1"), str(faulty / "shard-2"), "--out",
                         str(faulty / "night")]) == 1
    records = _records(faulty / "night")
    assert len(records) == 4 * 3 * 3  # the whole slice at head dim 64: 4 configs x 3 layouts x 3 dtypes
    assert sum(r.outcome == "passed" for r in records) == 3 + 18 and sum(r.outcome == "not_run" for r in records) == 15
    summary = (faulty / "night" / "summary.md").read_text()
    assert "not run: no process finished it" in summary and "Not all shards finished" in summary, summary
    # A shard that left nothing at all: its runs are not run, the night still reports.
    assert nightly.main(["merge", str(faulty / "shard-2"), str(faulty / "no-such-shard"), "--out",
                         str(faulty / "half")]) == 1
    assert sum(r.outcome == "not_run" for r in _records(faulty / "half")) == 18


def test_a_second_gate_on_the_same_folder_is_refused_and_no_night_is_lost(faulty, capsys):
    first = _gate(faulty, "held", "report", popen=True)
    lock = faulty / "report" / journal.LOCK_NAME
    deadline = time.monotonic() + 120
    while not (lock.exists() and "pid" in lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(SystemExit) as second:  # in this process, as a second command would
        nightly.main(["--fmha-device", "cpu", "--head-dims", "64", "--fmha-kernel", "faulty:fine", "--out", "report"])
    said = capsys.readouterr().err
    assert second.value.code == 2 and "another gate or merge is writing this report folder" in said, said
    (faulty / "go").touch()
    assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    history = [json.loads(line) for line in (faulty / "report" / "history.jsonl").read_text().splitlines()]
    assert [h["kernel"] for h in history] == ["faulty:held"], history


def test_a_gated_kernel_that_ran_nothing_fails_the_gate():
    ran_nothing = [RunRecord("paged-only", "gate", f"case-{i}", "bf16", outcome="skipped", message="no dense keys",
                             where=dict(config=f"case-{i}", distribution="normal", seed=0)) for i in range(3)]
    summary, failing = nightly.summarize(ran_nothing, None, "# night")
    assert failing and "paged-only: no run returned an answer (3 skipped, 0 raised, 0 not run)" in summary, summary
    summary, failing = nightly.summarize(ran_nothing, None, "# night", allow_no_runs=True)
    assert not failing, summary


def test_a_torn_last_line_of_a_journal_is_left_out(tmp_path):
    path = tmp_path / "runs.jsonl"
    with journal.Journal(path) as runs:
        runs.add({"plan": []})
        runs.add({"record": {"what": "a"}})
    with open(path, "a") as f:
        f.write('{"record": {"wh')  # its writer killed mid-line
    assert journal.read_journal(path) == [{"plan": []}, {"record": {"what": "a"}}]
