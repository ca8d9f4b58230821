"""fmha as a kernel author meets it: built into a wheel, installed into a fresh virtual
environment, and run with the README's command from a directory that holds only their
kernel. A failure's printed reproduce command reproduces it from that directory.

The one shortcut: the new environment takes torch, triton, hypothesis and pytest from this
one (a directory of links to them, never to this checkout's own editable fmha), because
downloading torch again would take minutes.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

from fmha.ci import bytecode

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ["fmha", "oracles", "properties", "regressions", "ci", "pyproject.toml", "README.md"]

# A plain eager kernel with one bug: it ignores `scale` (always D ** -0.5).
MYKERNEL = textwrap.dedent('''
    import math
    import torch

    def fwd(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        B, T, H, D = q.shape
        S, group = k.shape[1], H // k.shape[2]
        keys = k.double().repeat_interleave(group, 2)
        values = v.double().repeat_interleave(group, 2)
        s = torch.einsum("bthd,bshd->bhts", q.double(), keys) * D ** -0.5
        row = torch.arange(T, device=q.device)[:, None] + S - T
        col = torch.arange(S, device=q.device)[None, :]
        visible = torch.ones(T, S, dtype=torch.bool, device=q.device)
        if causal or window:
            visible &= col <= row
        if window:
            visible &= col > row - window
        s = s.masked_fill(~visible, -math.inf)
        if sink is not None:
            s = torch.cat([s, sink.double().view(1, -1, 1, 1).expand(B, H, T, 1)], dim=-1)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None])[..., :S]
        o = torch.einsum("bhts,bshd->bthd", p, values).to(q.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        return o, lse.float()
''')

# The README's command for a kernel of one's own (tests/test_workflows.py checks the README has it).
COMMAND = ["pytest", "--pyargs", "fmha", "--fmha-kernel", "mykernel:fwd"]


def _run(args, cwd, env, timeout=600):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(environment for subprocesses, the fresh venv's bin directory, the user's directory)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"  # a copy: building in place would leave build/ in the checkout
    source.mkdir()
    for name in PACKAGED:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, source / name)
    wheels = root / "wheels"
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                  str(source)], root, os.environ)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("fmha-*.whl")

    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    site = Path(_run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     root, os.environ).stdout.strip())
    deps = root / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("fmha", "__editable__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    (site / "dependencies.pth").write_text(f"{deps}\n")
    # The console script pip would write for pytest: its directory, not the user's, on sys.path, and
    # the main guard (a child that multiprocessing starts re-imports the script: without the guard it
    # would run a session of its own)
    script = bin_dir / "pytest"
    script.write_text(f"#!{bin_dir / 'python'}\nimport sys\nfrom pytest import console_main\n\n"
                      "if __name__ == '__main__':\n    sys.exit(console_main())\n")
    script.chmod(0o755)
    # the user's environment: not this session's bytecode cache either (pip would record the
    # package's bytecode there, outside its site-packages)
    env = {k: v for k, v in bytecode.without_the_cache(os.environ).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", CI="true")
    install = _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   root, env)
    assert install.returncode == 0, install.stdout + install.stderr

    user = root / "user"
    user.mkdir()
    (user / "mykernel.py").write_text(MYKERNEL)
    return env, bin_dir, user


@pytest.mark.starts_first  # builds the wheel and its virtual environment on its worker
def test_the_wheel_installs_nothing_but_the_fmha_package(installed):
    env, bin_dir, user = installed
    show = _run([str(bin_dir / "python"), "-m", "pip", "show", "-f", "fmha"], user, env)
    assert show.returncode == 0, show.stdout + show.stderr
    files = [line.strip() for line in show.stdout.split("Files:")[1].splitlines() if line.strip()]
    top_level = {f.split("/")[0] for f in files}
    assert top_level == {"fmha", "fmha-0.1.0.dist-info"}, sorted(top_level)
    assert {"fmha/oracles/dense_reference.py", "fmha/properties/dense_laws.py", "fmha/regressions/traps/__init__.py",
            "fmha/ci/plugin.py"} <= set(files)


@pytest.mark.starts_first  # a nested collection of the installed package
def test_the_readme_command_collects_properties_and_regressions_for_the_users_kernel(installed):
    env, _, user = installed
    collected = _run(COMMAND + ["--collect-only", "-q", "-p", "no:cacheprovider"], user, env)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = collected.stdout
    for test in ("properties/test_laws.py::test_agrees_with_the_oracle[mykernel:fwd]",
                 "properties/test_grid.py::test_grid_config_matches_oracle[mykernel:fwd-",
                 "regressions/test_traps.py::test_named_regression_case[mykernel:fwd-"):
        assert test in ids, f"{test} not collected:\n{ids[-3000:]}"
    # nothing written beside the kernel but tools' hidden folders (.hypothesis, .benchmarks)
    assert [p.name for p in user.iterdir() if not p.name.startswith(".")] == ["mykernel.py"]


@pytest.mark.starts_first  # a nested session of the installed package: the module's longest test
def test_a_failure_prints_a_command_that_reproduces_it_from_the_users_directory(installed):
    env, _, user = installed
    run = _run(COMMAND + ["-p", "no:cacheprovider", "-x", "-k", "test_kernel_matches_oracle and scale0.3 and bf16"],
               user, env)
    output = run.stdout
    assert run.returncode == 1, output[-3000:] + run.stderr[-3000:]
    assert "the scale argument ignored" in output, output[-3000:]
    found = re.search(r"^(pytest .*--fmha-kernel mykernel:fwd.*)$", output, re.M)
    assert found, f"no reproduce command in the output:\n{output[-3000:]}"
    again = _run(shlex.split(found.group(1)) + ["-p", "no:cacheprovider"], user, env)
    assert again.returncode == 1 and "the scale argument ignored" in again.stdout, again.stdout[-3000:]
    assert re.search(r"\b1 failed\b", again.stdout), again.stdout[-1000:]


REPRODUCER = ("Sample(problem=Problem(batch=1, q_len=3, kv_len=17, heads_q=2, heads_kv=2, head_dim=32, "
              "dtype=torch.float16), scale=0.3)")


def _printed(output: str, label: str) -> list[str]:
    found = re.search(rf"^{label}\s+(pytest .*?)(\s+\(fails\))?$", output, re.M)
    assert found, f"no '{label}' command in:\n{output}"
    return shlex.split(found.group(1))


def _on_the_cpu(env: dict) -> dict:
    """The CPU tier's run of a workflow, whatever the machine (the printed commands name no device)."""
    return {**env, "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.cpu_tier
@pytest.mark.starts_first  # four nested sessions of the installed package
def test_a_regression_added_in_the_users_repository_fails_on_the_bug_then_passes_on_the_fix(installed):
    env, bin_dir, user = installed
    env = _on_the_cpu(env)
    repo = user.parent / "my_repo"  # the author's repository: their kernel, the buggy version kept as the mutant
    repo.mkdir()
    (repo / "mykernel.py").write_text(MYKERNEL)
    (repo / "mykernel_v0.py").write_text(MYKERNEL)
    new = _run([str(bin_dir / "python"), "-m", "fmha.regressions", "new", "scale-ignored", "--reproducer", REPRODUCER,
                "--seed-logs", "mykernel#3", "--symptom", "scale= has no effect", "--root-cause", "D ** -0.5 hard-coded",
                "--mutant", "mykernel_v0:fwd", "--fmha-kernel", "mykernel:fwd"], repo, env)
    assert new.returncode == 0, new.stdout + new.stderr
    assert (repo / "fmha_cases" / "scale_ignored.py").exists(), new.stdout  # in the repository, not site-packages
    catches, on_yours = _printed(new.stdout, "it catches the bug:"), _printed(new.stdout, "run it on your kernel:")

    before_fix = _run(on_yours + ["-p", "no:cacheprovider"], repo, env)
    assert before_fix.returncode == 1, before_fix.stdout[-3000:] + before_fix.stderr[-3000:]
    assert "fails named case scale-ignored/" in before_fix.stdout, before_fix.stdout[-3000:]
    assert _run(catches + ["-p", "no:cacheprovider"], repo, env).returncode == 1

    (repo / "mykernel.py").write_text(MYKERNEL.replace("* D ** -0.5", "* (D ** -0.5 if scale is None else scale)"))
    after_fix = _run(on_yours + ["-p", "no:cacheprovider", "-v"], repo, env)
    assert after_fix.returncode == 0, after_fix.stdout[-3000:] + after_fix.stderr[-3000:]
    # the named case on the kernel in each dtype, and the case seen failing on the kept mutant
    assert re.search(r"\b4 passed\b", after_fix.stdout), after_fix.stdout[-2000:]
    assert "test_your_case_fails_on_its_mutant[scale-ignored/" in after_fix.stdout, after_fix.stdout[-2000:]


@pytest.mark.cpu_tier
@pytest.mark.starts_first  # the main job and the gate, each a process of the installed package
def test_verify_and_the_nightly_gate_run_from_the_users_directory(installed):
    env, bin_dir, user = installed
    env = _on_the_cpu(env)
    python = str(bin_dir / "python")
    verify = _run([python, "-m", "fmha.ci.verify", "--fmha-kernel", "mykernel:fwd"], user, env)
    assert verify.returncode == 1, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert "the scale argument ignored" in verify.stdout, verify.stdout[-3000:]
    rerun = [line.split("    #")[0] for line in verify.stdout.splitlines() if line.startswith("python -m fmha.ci.verify ")]
    assert rerun and "--only" in rerun[0], verify.stdout[-3000:]
    again = _run([python, *shlex.split(rerun[0])[1:]], user, env)
    assert again.returncode == 1 and "1 failing case(s)" in again.stdout, again.stdout[-3000:]

    report = user.parent / "nightly-report"  # not beside the kernel: the collection test checks nothing is
    gate = _run([python, "-m", "fmha.ci.nightly", "--fmha-kernel", "mykernel:fwd", "--head-dims", "64",
                 "--out", str(report)], user, env)
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:]  # the grid's calls use the default scale
    page = (report / "index.html").read_text()
    assert 'id="threshold">0.999998<' in page and "PASSED" in page and "<h1>Nightly gate, " in page, page[:3000]
    for name in re.findall(r"<img class=\"\w+\" src=\"([^\"]+)\"", page) + ["junit.xml", "results.json"]:
        assert (report / name).stat().st_mode & 0o044 == 0o044, f"{name} is missing or not world-readable"
    assert re.findall(r"<img class=\"trend\"", page), page[-2000:]


@pytest.mark.cpu_tier
@pytest.mark.starts_first  # the main job and three pytest sessions of the installed package
def test_an_honest_narrow_declaration_passes_and_bad_input_is_a_usage_error_from_the_users_directory(installed):
    """A new user's first hour, from their directory: a correct paged kernel declaring one block
    size passes the main job (the law it cannot state skips, saying why) and leaves nothing
    beside it; a kernel refusing a call its declaration admits (NotSupportedError) passes the
    nightly gate, the refusal a skip with its text; a known-failures record naming no test, an
    empty --fmha-cases directory and a plug-in that does not compile each end the session with
    one paragraph naming what is wrong, no traceback (pytest's usage-error status, 4)."""
    from test_nightly import REFUSING
    from test_paged_plugin import VLLM_STYLE

    env, bin_dir, user = installed
    env = _on_the_cpu(env)
    work = user.parent / "paged_user"
    work.mkdir()
    (work / "vllm_style.py").write_text(VLLM_STYLE)
    verify = _run([str(bin_dir / "python"), "-m", "fmha.ci.verify", "--fmha-kernel", "vllm_style:pages_of_16"], work, env)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert re.search(r"Agreement: 0 of \d+ ran", verify.stdout), verify.stdout[:2000]  # paged only: no dense agreement case
    assert "declares one block size (16): no other size to compare with" in verify.stdout, verify.stdout[-3000:]
    assert sorted(p.name for p in work.iterdir() if p.name != "__pycache__") == ["vllm_style.py"]

    (work / "refusing_kernel.py").write_text(REFUSING)
    gate = _run([str(bin_dir / "python"), "-m", "fmha.ci.nightly", "--fmha-kernel", "refusing_kernel:fwd",
                 "--head-dims", "64", "--out", str(user.parent / "refusing-report")], work, env)
    assert gate.returncode == 0 and "no split for 100 keys yet" in gate.stdout, gate.stdout[-3000:] + gate.stderr[-2000:]

    (work / "misnamed.toml").write_text('[[known_failure]]\nkernel = "vllm_style:pages_of_16"\n'
                                        'test = "test_kernel_matches_the_oracle"\nreason = "x"\nissue = "x"\n')
    (work / "no_cases").mkdir()
    (work / "broken.py").write_text("def fwd(q, k, v,\n    return q\n")
    for options, says in [(["--fmha-kernel", "vllm_style:pages_of_16", "--fmha-known-failures", "misnamed.toml"],
                           "test 'test_kernel_matches_the_oracle' names no test of fmha's suite"),
                          (["--fmha-kernel", "vllm_style:pages_of_16", "--fmha-cases", "no_cases"],
                           "no_cases: expected trap modules"),
                          (["--fmha-kernel", "broken:fwd"], "'broken' does not compile")]:
        run = _run(["pytest", "--pyargs", "fmha", "--collect-only", "-q", "-p", "no:cacheprovider", *options], work, env)
        assert run.returncode == 4 and says in run.stderr, run.stdout[-2000:] + run.stderr[-2000:]
        assert "Traceback" not in run.stdout + run.stderr and "INTERNALERROR" not in run.stdout + run.stderr


# Each planted bug's own cause, which must lead every failure of it that names a cause
# (tests/planted_kernels.py): a bug given another bug's cause sends its author the wrong way.
PLANTED_CAUSES = {
    "gqa_interleaved": "query head h reading KV head h % Hkv",
    "max_before_mask": "the row max taken before the mask",
    "window_nan": "left of every row's window, which no row may read",
    "full_last_page_empty": "fill their last page exactly",
}
# What the outputs unlike the declared ones fail with, by name, before any value is judged.
PLANTED_NAMES = {
    "lse_none": "declares lse (Capabilities.features) but returned (o, None)",
    "lse_bf16": "torch.float32 (the contract's: log Z per row, natural log), got",
}


@pytest.mark.cpu_tier
@pytest.mark.starts_first  # verify over eight kernels, from the wheel
def test_a_kernel_authors_planted_bugs_fail_with_their_own_cause_and_the_correct_kernels_pass(installed):
    """A new user's plain-torch kernels (a causal-only dense kernel and a decode kernel of one row
    and pages of 16, each correct, and six bugs): the correct ones pass; the LSE mistakes fail by
    name; each other bug's failures lead with its own cause; the decode kernel's last-page bug is
    caught by at least three test functions."""
    env, bin_dir, user = installed
    env = _on_the_cpu(env)
    work = user.parent / "first_hour"
    work.mkdir()
    shutil.copy(ROOT / "tests" / "planted_kernels.py", work)
    kernels = ["causal_only", "decode", *PLANTED_CAUSES, *PLANTED_NAMES]
    verify = _run([str(bin_dir / "python"), "-m", "fmha.ci.verify", "--json", "verify.json",
                   *(f"--fmha-kernel=planted_kernels:{name}" for name in kernels)], work, env)
    assert verify.returncode == 1, verify.stdout[-3000:] + verify.stderr[-3000:]
    bad = {}
    records = json.loads((work / "verify.json").read_text())["results"]
    for record in records:
        if record["outcome"] in ("failed", "raised"):
            bad.setdefault(record["kernel"].removeprefix("planted_kernels:"), []).append(record["message"])
    assert not bad.get("causal_only") and not bad.get("decode"), (bad.get("causal_only") or bad.get("decode"))[:3]
    for name, said in PLANTED_NAMES.items():
        assert bad.get(name) and all(said in message for message in bad[name]), (name, bad.get(name, [])[:3])
    for name, cause in PLANTED_CAUSES.items():
        caused = [m for m in bad.get(name, ()) if "likely cause: " in m]
        assert caused, (name, bad.get(name, [])[:3])
        wrong = [m for m in caused if cause not in m.split("likely cause: ")[1]]
        assert not wrong, (name, wrong[:2])

    # The test functions the last-page bug fails, from verify's records: each names the pytest test
    # that makes the same check, as `pytest --pyargs fmha` over the same kernel would fail them.
    functions = {record["test"] for record in records
                 if record["kernel"] == "planted_kernels:full_last_page_empty" and record["outcome"] in ("failed", "raised")}
    assert len(functions) >= 3, (functions, bad.get("full_last_page_empty", [])[:3])
