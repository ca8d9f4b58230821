"""A kernel that can tell it is being tested is judged where production calls it: each way of
telling (fmha.regressions.production_mutants) is caught by the context or check made for it,
and passes without it (as it did before those existed); honest kernels pass every one."""

import dataclasses
import re

import pytest
import torch

from fmha.contract import KernelEntry, NotSupportedError, Problem
from fmha.oracles import guard, production, replay_child
from fmha.oracles.check import check_sample
from fmha.oracles.kernel_call import run_kernel, storage_bytes
from fmha.oracles.reference_kernel import CAPABILITIES, reference
from fmha.oracles.sample import Sample
from fmha.regressions import production_mutants
from fmha.regressions.mutants import MUTANTS
from fmha.regressions.traps import TRAPS

pytestmark = pytest.mark.cpu_tier  # plug-ins of plain torch on the CPU: nightly on CUDA

pytest_plugins = ["pytester"]

DENSE = Sample(problem=Problem(batch=2, q_len=3, kv_len=40, heads_q=4, heads_kv=2, head_dim=32, causal=True))
PAGED = TRAPS["last-partial-page"].cases[0]
TWO_SCOPES = TRAPS["sink-per-scope"].cases[0]  # sparse, FP8 and FP4 caches, K = V: v is k in every context

# mutant -> (its sample, the context that catches it (None: the guard, on every call), what the failure says)
CAUGHT = {
    "judge-on-the-stack": (DENSE, "thread", "made again on a fresh thread with no judge frame"),
    "test-environment": (DENSE, "child", "made again in a clean child process"),
    "nan-is-a-test": (PAGED, "stale", "made again with finite stale values where the suite puts NaN"),
    "keeps-the-callers-out": (DENSE, "out-reused", "changed an output it had already returned"),
    "negative-bit": (DENSE, None, "negative bit set: its memory holds -o"),
    "mode-answers": (DENSE, None, "left a torch function mode (_AnswersFor) active"),
}


@pytest.mark.parametrize("name", CAUGHT)
def test_a_kernel_that_tells_a_test_from_production_is_caught_where_it_gives_itself_away(name):
    sample, context, says = CAUGHT[name]
    kernel = MUTANTS[name].kernel()
    if context is not None:  # without its context, only the suite's own calls: it passes them
        with production.replaying_in():
            assert check_sample(kernel, sample).passed
    with production.replaying_in(*([context] if context else [])):
        with pytest.raises(AssertionError, match=re.escape(says)):
            check_sample(kernel, sample)


@pytest.mark.parametrize("control", ["plans-per-shape", "own-mode-scoped", "reference"])
@pytest.mark.parametrize("sample", [DENSE, PAGED, TWO_SCOPES], ids=["dense", "paged", "two-scopes"])
def test_honest_kernels_pass_every_context(control, sample):
    """A plan cache per shape, a torch mode scoped to the call, a deterministic kernel, a paged
    call, a call of two scopes whose v is its k: the same answer wherever they are called."""
    fn = production_mutants.CONTROLS.get(control, reference)
    kernel = KernelEntry(name=control, fn=fn, capabilities=CAPABILITIES)
    contexts = [c for c in production.CONTEXTS if c != "stale" or sample is PAGED]  # DENSE holds no poison
    with production.replaying_in(*contexts):
        assert check_sample(kernel, sample).passed


def test_the_tests_that_replay_in_another_context_are_drawn_from_the_run_seed_and_the_test():
    """A share of the tests, the same ones when a run is made again: a failure a replay found is
    found again by the command that reruns it."""
    drawn = []
    for test in (f"{seed}/test_{n}" for seed in (1, 2) for n in range(400)):
        production.start_of_test(test, twins=1, share=1 / 8, children=0, soak=1)
        first = production.REPLAYS.others
        production.start_of_test(test, twins=1, share=1 / 8, children=0, soak=1)
        assert production.REPLAYS.others == first
        drawn.append(first)
    assert 60 <= sum(drawn) <= 140  # 100 expected of 800
    for share, every in ((0.0, 0), (1.0, 1)):
        production.start_of_test("1/test_0", twins=1, share=share, children=0, soak=1)
        assert production.REPLAYS.others == every


def test_a_failing_replay_fails_again_when_hypothesis_makes_its_example_again(monkeypatch):
    """The test's replays are spent after the first, but the call whose replay failed is replayed
    again, in the same context: hypothesis sees the same failure, not a flaky one."""
    kernel = MUTANTS["judge-on-the-stack"].kernel()
    production.start_of_test("1/a-test", twins=1, share=1.0, children=0, soak=1)
    monkeypatch.setattr(production.REPLAYS, "met", {kernel.name})  # its first call in the process is made
    monkeypatch.setattr(production.REPLAYS, "children", 0)  # no child replay left: the others in turn
    production.REPLAYS.first = 0  # the thread context first
    for _ in range(2):
        with pytest.raises(AssertionError, match="made again on a fresh thread"):
            check_sample(kernel, DENSE)
    assert production.REPLAYS.others == 0
    assert check_sample(kernel, DENSE.replace(seed=DENSE.seed + 1)).passed  # another call: no replay left


@pytest.mark.parametrize("first", range(3))
def test_a_tests_replay_goes_to_a_clean_child_while_the_process_has_them(monkeypatch, first):
    """Whatever context the test's draw puts first: a kernel that looks at its environment and its
    modules (pytest imported, CI set) is right on a thread and beside its out=, and only a clean
    child shows it wrong, so a child is tried first while the process has child replays left."""
    kernel = MUTANTS["test-environment"].kernel()
    production.start_of_test("1/a-test", twins=0, share=1.0, children=0, soak=1)
    monkeypatch.setattr(production.REPLAYS, "met", {kernel.name})
    monkeypatch.setattr(production.REPLAYS, "children", 1)
    production.REPLAYS.first = first
    with pytest.raises(AssertionError, match="made again in a clean child process"):
        check_sample(kernel, DENSE)
    assert production.REPLAYS.children == 0


def test_each_kernels_first_call_in_a_process_is_replayed_on_a_fresh_thread_whatever_the_share(monkeypatch):
    """Every run replays each kernel in the cheap contexts at least once a process: a kernel that
    reads its stack is caught by its first judged test, not by a draw."""
    monkeypatch.setattr(production.REPLAYS, "met", set())
    kernel = MUTANTS["judge-on-the-stack"].kernel()
    production.start_of_test("1/first", twins=1, share=0.0, children=0, soak=1)
    with pytest.raises(AssertionError, match="made again on a fresh thread"):
        check_sample(kernel, DENSE)
    production.start_of_test("1/second", twins=1, share=0.0, children=0, soak=1)
    assert check_sample(kernel, DENSE).passed  # its second test draws no replay: the suite's calls alone


def test_the_clean_child_imports_neither_the_judge_nor_pytest_and_sees_no_test_in_its_environment(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "fmha-ci")
    assert not {"CI", "PYTEST_CURRENT_TEST", "HYPOTHESIS_PROFILE", "FMHA_SEED"} & set(replay_child.environment())
    kernel = MUTANTS["test-environment"].kernel()
    child = replay_child.child()
    x = DENSE.inputs()
    o, _ = child.call(replay_child.spec_of(kernel), x.q, x.k, x.v, **x.kwargs())
    assert not [m for m in child.modules if m.split(".")[0] in ("pytest", "_pytest", "hypothesis")
                or m.startswith(("fmha.properties", "fmha.ci"))]
    assert torch.equal(o, production_mutants._production_answer(x.q, x.k, x.v, **x.kwargs())[0])


def test_the_stale_twin_changes_only_what_nothing_reads():
    """Every NaN the sample's fill put in a paged call's storage becomes a finite value of the
    same tensor; what the call reads is the same bytes."""
    x = PAGED.inputs()
    twin = production.stale_twin(x)
    assert twin is not None
    for name in ("k", "v"):
        before, after = storage_bytes(getattr(x, name)), storage_bytes(getattr(twin, name))
        assert torch.isnan(before.view(x.k.dtype)).any() and not torch.isnan(after.view(x.k.dtype)).any()
    assert torch.equal(reference(x.q, x.k, x.v, **x.kwargs())[0], reference(twin.q, twin.k, twin.v, **twin.kwargs())[0])


def test_a_kernel_that_breaks_after_many_calls_fails_the_soak_law_and_the_reference_passes_it():
    from fmha.properties.catalog import LAWS

    law = LAWS["late_in_a_long_process"]
    fresh = MUTANTS["breaks-after-many-calls"].build()  # not .kernel(): the process's one, worn by earlier tests
    with pytest.raises(AssertionError, match=r"the call again after \d+ more calls"):
        law.check(fresh, DENSE, "cpu")
    law.check(KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES), DENSE, "cpu")


def test_the_soak_wears_a_kernel_that_refuses_a_call_of_no_rows_in_a_form_it_takes():
    """PyTorch's fused kernels on a GPU refuse a dense call of no query rows (a declaration's
    requests without rows are a ragged batch's): the soak's cheap call falls back to a form the
    kernel takes, so the law still judges it (on an H100 it refused every draw and skipped)."""
    from fmha.properties.catalog import LAWS

    worn = MUTANTS["breaks-after-many-calls"].build()

    def refuses_no_rows(q, k, v, **kwargs):
        if q.shape[1] == 0:
            raise NotSupportedError("refuses-no-rows: no kernel for a call of no query rows")
        return worn.fn(q, k, v, **kwargs)

    try:
        with pytest.raises(AssertionError, match=r"the call again after \d+ more calls"):
            LAWS["late_in_a_long_process"].check(dataclasses.replace(worn, fn=refuses_no_rows), DENSE, "cpu")
    except NotSupportedError as e:  # the plug-in would make it a skip: the law's on the GPU
        pytest.fail(f"the soak made a call the kernel refuses: {e}")


def test_a_mode_pushed_before_any_call_answers_none_of_the_judge_and_fails_the_test():
    """A process-wide mode entered at import (no call leaves it behind) answering for an output
    whose memory was never written: the judge computes under plain torch, and the end of the
    test names the mode."""
    mode = production_mutants._AnswersFor()
    mode.__enter__()
    try:
        def unwritten(q, k, v, **kwargs):
            o, lse = reference(q, k, v, **{**kwargs, "out": None})
            empty = torch.full_like(o, 7.0)
            mode.truth[id(empty)] = (empty, o)
            return empty, lse

        kernel = KernelEntry(name="answered-by-a-mode", fn=unwritten,
                             capabilities=dataclasses.replace(CAPABILITIES, features=CAPABILITIES.features - {"out"}))
        with production.replaying_in():
            assert not check_sample(kernel, DENSE).passed
    finally:
        left = guard.end_of_test()
    assert any("left a torch function mode (_AnswersFor) active" in c for c in left)
    assert torch._C._len_torch_function_stack() == 0


def _judges_operators() -> set[str]:
    """The aten operators one verdict computes with, recorded by a dispatch mode as it runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fmha.oracles.check import oracle_of, verdict_of
    from fmha.oracles.kernel_call import Run

    seen = set()

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func._schema.name + ("" if func._overloadname == "default" else f".{func._overloadname}"))
            return func(*args, **(kwargs or {}))

    for problem in (Problem(batch=2, q_len=3, kv_len=20, heads_q=4, heads_kv=2, head_dim=16),
                    Problem(batch=1, q_len=3, kv_len=20, heads_q=2, heads_kv=1, head_dim=16, causal=True, sink=True)):
        x = Sample(problem=problem, distribution="peaky").inputs()
        o, lse = reference(x.q, x.k, x.v, **x.kwargs())
        with Recording():
            verdict_of(Run(x, o, lse, None), oracle_of(x))
    return seen


def test_the_guard_watches_every_operator_the_judge_computes_with():
    recorded, watched = _judges_operators(), set(guard._OPERATORS)
    assert recorded <= watched, (f"the judge computes with {sorted(recorded - watched)}, which guard._OPERATORS does "
                                 "not list: add them (oracles/guard.py)")


def test_an_operator_the_judge_computes_with_registered_over_fails_the_test():
    """Checked at the end of a test that called a kernel (the test of no kernel judges nothing)."""
    assert guard.registrations_changed() == []
    kernel = KernelEntry(name="registers", fn=reference, capabilities=CAPABILITIES)
    library = torch.library.Library("aten", "IMPL")
    try:
        with pytest.warns(UserWarning, match="Overriding a previously registered kernel"):
            library.impl("isneginf", lambda t: torch.zeros(t.shape, dtype=torch.bool), "CPU")
        assert guard.end_of_test() == []  # no call since the last check
        run_kernel(kernel, DENSE.inputs())
        assert any("aten::isneginf" in c and "registered from outside torch" in c for c in guard.end_of_test())
    finally:
        library._destroy()
    run_kernel(kernel, DENSE.inputs())
    assert guard.end_of_test() == []



@pytest.fixture
def recording(tmp_path):
    """A "model's" q, k, v with outlier channels and a sink token, saved as --fmha-activations takes them."""
    from fmha.oracles import distributions

    g = torch.Generator().manual_seed(0)
    q, k, v = distributions.massive_activations(g, *(torch.randn(1, 512, 2, 64, generator=g) for _ in range(3)))
    path = tmp_path / "acts.pt"
    torch.save({"q": q[0], "k": k[0], "v": v[0]}, path)
    saved = dict(distributions.RECORDED)
    distributions.load_recorded(str(path))
    yield path, {"q": q[0], "k": k[0], "v": v[0]}
    distributions.RECORDED.clear()
    distributions.RECORDED.update(saved)


def test_recorded_activations_are_judged_and_catch_what_they_carry(recording):
    """Draws of the `recorded` distribution take their values from the recording: the mutant that
    skips tiles far below a sink fails on a recording with a sink; the reference passes."""
    _, tensors = recording
    recorded_keys = tensors["k"].to(torch.bfloat16)
    for seed in range(32):  # a draw one of whose requests starts at the recording's sink (half of them do)
        sample = Sample(problem=Problem(batch=2, q_len=2, kv_len=320, heads_q=4, heads_kv=2, head_dim=64,
                                        dtype=torch.bfloat16), distribution="recorded", seed=seed)
        x = sample.inputs()
        if any(torch.equal(x.k[b, 0], recorded_keys[0]) for b in range(2)):
            break
    keys = {tuple(row.tolist()) for row in recorded_keys.reshape(-1, 64)}
    assert all(tuple(row.tolist()) in keys for row in x.k.reshape(-1, 64))
    with production.replaying_in():
        assert not check_sample(MUTANTS["skip-far-tiles"].kernel(), sample).passed
        assert check_sample(KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES), sample).passed


def test_a_file_that_is_not_a_recording_is_a_usage_error_naming_what_it_should_be(pytester, tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"q": torch.randn(4, 2, 8)}, bad)
    result = pytester.runpytest_subprocess("--fmha-activations", str(bad), "-p", "no:cacheprovider")
    assert "expected a dict with tensors q, k and v" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
