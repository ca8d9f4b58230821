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
