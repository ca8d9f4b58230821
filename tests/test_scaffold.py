"""`python -m fmha.regressions new` turns the property suite's shrunk case into a trap module
that loads and runs."""

import importlib.util

import pytest
import torch

from fmha.contract import Problem
from fmha.oracles.sample import Sample
from fmha.regressions.cli import main
from fmha.regressions.selection import resolve_kernel
from fmha.regressions.trap import check_case

PRINTED = ("pin it: @example(sample=Sample(problem=Problem(batch=1, q_len=3, kv_len=17, heads_q=4, heads_kv=2, "
           "head_dim=32, dtype=torch.float16, window=5, sink=True), distribution='peaky', seed=12, "
           "k_storage='sliced', v_storage='sliced'))")


def _load(path):
    spec = importlib.util.spec_from_file_location("scaffolded_trap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _new(tmp_path, *extra):
    return main(["new", "window-edge", "--reproducer", PRINTED, "--seed-logs", "my-kernel#42",
                 "--symptom", "the oldest key of the window is dropped", "--root-cause", "off-by-one in the window start",
                 "--dir", str(tmp_path), *extra])


def test_the_printed_reproducer_becomes_a_trap_that_runs(tmp_path, device):
    assert _new(tmp_path) == 0
    module = _load(tmp_path / "window_edge.py")
    case = module.TRAP.cases[0]
    assert case == Sample(problem=Problem(batch=1, q_len=3, kv_len=17, heads_q=4, heads_kv=2, head_dim=32,
                                          dtype=torch.float16, window=5, sink=True),
                          distribution="peaky", seed=12, k_storage="sliced", v_storage="sliced")
    assert module.MUTANTS == ()  # the kill-matrix test fails until a mutant proves the case
    assert check_case(resolve_kernel("fmha"), case, device) == []


def test_a_mutant_given_by_import_path_is_wired_in(tmp_path):
    assert _new(tmp_path, "--mutant", "mutant:missing-scale", "--why", "window 5 of 17 keys") == 0
    module = _load(tmp_path / "window_edge.py")
    (mutant,) = module.MUTANTS
    assert mutant.trap == "window-edge" and mutant.kernel().name == "mutant:window-edge"
    assert module.TRAP.cases[0].name == "window 5 of 17 keys"


@pytest.mark.parametrize("args, message", [
    (["new", "Bad_Id", "--reproducer", "Problem(batch=1, q_len=1, kv_len=1, heads_q=1, heads_kv=1, head_dim=16)"],
     "id: expected kebab-case"),
    (["new", "ok-id", "--reproducer", "Problem(batch=1"], "reproducer: expected 'Sample(problem=Problem(...), ...)'"),
    (["new", "ok-id", "--reproducer", "Problem(1, 1, 1, 1, 1, 16)"], "takes 1 positional argument"),
    (["new", "ok-id", "--reproducer", "42"], "reproducer: expected a Sample or a Problem, got int"),
])
def test_bad_input_is_refused_naming_the_argument(tmp_path, capsys, args, message):
    argv = args + ["--seed-logs", "x", "--symptom", "x", "--root-cause", "x", "--dir", str(tmp_path)]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_existing_id_is_refused(tmp_path, capsys):
    assert _new(tmp_path) == 0
    assert _new(tmp_path) == 2
    assert "exists already" in capsys.readouterr().err


def test_outside_fmhas_checkout_it_writes_into_the_current_repository(tmp_path, monkeypatch, capsys):
    """Never into the installed package: a kernel author's run writes ./fmha_cases and prints
    the command that collects it from there."""
    monkeypatch.chdir(tmp_path)
    assert main(["new", "window-edge", "--reproducer", PRINTED, "--seed-logs", "x", "--symptom", "x", "--root-cause", "x",
                 "--fmha-kernel", "my_attn:fwd"]) == 0
    assert (tmp_path / "fmha_cases" / "window_edge.py").exists()
    printed = capsys.readouterr().out
    assert "pytest --pyargs fmha --fmha-cases fmha_cases -k window-edge --fmha-kernel my_attn:fwd" in printed, printed


def test_a_bad_cases_directory_is_refused_naming_it(tmp_path):
    from fmha.regressions.traps import load_directory

    with pytest.raises(ValueError, match="--fmha-cases .*missing: expected a directory of trap modules"):
        load_directory(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="expected trap modules .* found no .py file there"):
        load_directory(str(tmp_path))  # empty
    (tmp_path / "broken.py").write_text("import no_such_module\n")
    with pytest.raises(ValueError, match=r"broken.py does not import: ModuleNotFoundError"):
        load_directory(str(tmp_path))
