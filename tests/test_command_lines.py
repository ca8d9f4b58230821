"""Every command names kernels and devices with the same options (regressions/selection.py) and
answers a name nothing answers to with the same usage error: exit status 2, one paragraph that
says what there is, no traceback."""

import pytest

from fmha.ci import kernels, nightly, sanitize, verify
from fmha.regressions import cli

COMMANDS = {
    "fmha.ci.verify": verify.main,
    "fmha.ci.nightly": nightly.main,
    "fmha.ci.kernels": kernels.main,
    "fmha.ci.sanitize": sanitize.main,
    "fmha.regressions matrix": lambda argv: cli.main(["matrix", *argv]),
}


def _exit_status(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage error
        return e.code


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("spec, says", [("nosuch", "unknown name; registered: fmha,"),
                                        ("mutant:no-scal", "did you mean mutant:no-scale"),
                                        ("no_such_module:fwd", "cannot import 'no_such_module'")])
def test_a_kernel_nothing_answers_to_is_a_usage_error(command, spec, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command that went on would write its outputs here
    assert _exit_status(COMMANDS[command], ["--fmha-kernel", spec, "--fmha-device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and says in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir()), "a refused command wrote files"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_the_same_device_option(command, capsys):
    assert _exit_status(COMMANDS[command], ["--fmha-device", "tpu"]) == 2
    assert "--fmha-device: invalid choice: 'tpu' (choose from" in capsys.readouterr().err


def test_verify_and_matrix_outside_the_checkout_leave_nothing_in_the_current_directory(capsys, tmp_path, monkeypatch):
    """A kernel author's repository gets no .hypothesis/ and no kill-matrix files: the page goes
    to stdout, the rows to the user's cache."""
    from fmha.kernels import triton_utils
    from fmha.regressions import kill_matrix

    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert verify.main(["--fmha-kernel", "sdpa-math", "--fmha-device", "cpu", "--law-examples", "1",
                        "--only", "linear_in_v"]) == 0
    monkeypatch.setattr(kill_matrix, "build", lambda *a, **k: [])
    monkeypatch.setattr(kill_matrix, "correct_kernel_failures", lambda *a, **k: {"sdpa-math": []})
    monkeypatch.setattr(triton_utils, "interpreting", lambda: True)  # no row runs a Triton kernel here, on a GPU runner too
    assert cli.main(["matrix", "--fmha-kernel", "sdpa-math", "--fmha-device", "cpu"]) == 0
    assert "# Kill matrix" in capsys.readouterr().out
    assert not list(work.iterdir()), sorted(p.name for p in work.iterdir())
    assert (cache / "fmha" / "kill-matrix-rows.json").exists()


def test_every_command_the_docs_give_names_a_module_that_runs():
    """`python -m X` in the README, BENCHMARKS.md and the docs beside the code: X exists in the
    installed package (oracles/CALIBRATION.md once gave `python -m ci.verify`)."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    docs = [root / "README.md", root / "BENCHMARKS.md", *root.glob("docs/*.md"), *root.glob("oracles/*.md")]
    missing = []
    for doc in docs:
        for module in set(re.findall(r"python3? -m ([A-Za-z_][\w.]*)", doc.read_text())):
            try:
                spec = importlib.util.find_spec(module)
            except ModuleNotFoundError:
                spec = None
            # the checkout's folders import from its root (ci.verify): a user has fmha.ci.verify
            in_checkout = spec is not None and root in Path(spec.origin or "").parents and module.split(".")[0] != "fmha"
            missing += [f"{doc.relative_to(root)}: python -m {module}"] if spec is None or in_checkout else []
    assert not missing, f"commands whose module does not exist: {missing}"
