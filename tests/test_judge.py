"""The judge cannot be gamed by a kernel that does not compute the answer: one that changes its
inputs, one that returns an answer it cached by address or shape, one that returns a float64
answer it found among the process's objects. Each fails a test named for it (or finds nothing
to return)."""

import re
import textwrap

import pytest
import torch

from fmha.contract import KernelEntry, Problem
from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import CAPABILITIES, reference
from fmha.oracles.sample import Sample
from fmha.properties.catalog import LAWS
from fmha.regressions.mutants import MUTANTS
from fmha.regressions.traps import TRAPS

pytestmark = pytest.mark.cpu_tier  # eager plug-ins and a nested session on the CPU: nightly on CUDA

pytest_plugins = ["pytester"]

# A kernel that looks through every object of the process for a float64 tensor shaped like its
# output before it computes anything (a generated kernel found the framework's reference this
# way), logs what it finds, and answers honestly.
SEARCHING = textwrap.dedent('''
    import gc, os
    import torch
    from fmha.oracles.reference_kernel import CAPABILITIES, reference

    def searching(q, k, v, **kwargs):
        rows = tuple(q.shape[:-1])  # (B, T, Hq) or, ragged, (total_q, Hq): o's shape but its last dim
        found = [obj for obj in gc.get_objects() if torch.Tensor in type(obj).__mro__ and obj.dtype == torch.float64
                 and obj.dim() == q.dim() and tuple(obj.shape[:-1]) == rows]
        if found:
            source = ("sparse" if kwargs.get("indices") is not None else
                      "paged" if kwargs.get("block_table") is not None else "dense")
            with open(os.environ["FMHA_FOUND"], "a") as log:
                log.write(f"{len(found)} {source} {rows}\\n")
        return reference(q, k, v, **kwargs)

    searching.capabilities = CAPABILITIES
''')


def test_a_kernel_that_modifies_its_input_fails_naming_the_input():
    def scales_k_in_place(q, k, v, **kwargs):
        k.mul_(2)  # saves a multiply per logit
        return reference(q, k, v, **kwargs)

    kernel = KernelEntry(name="scales-k-in-place", fn=scales_k_in_place, capabilities=CAPABILITIES)
    sample = Sample(problem=Problem(batch=1, q_len=2, kv_len=5, heads_q=2, heads_kv=1, head_dim=16))
    with pytest.raises(AssertionError, match="the kernel modified its input k"):
        check_sample(kernel, sample)


def test_a_kernel_that_writes_past_its_view_of_a_cache_fails_naming_the_cache():
    """A paged kernel that scribbles on pages nothing reads modifies its input all the same."""
    def scribbles(q, k, v, **kwargs):
        k.view(-1)[-1] = 0  # the last slot: poison no request reads
        return reference(q, k, v, **kwargs)

    kernel = KernelEntry(name="scribbles", fn=scribbles, capabilities=CAPABILITIES)
    case = TRAPS["last-partial-page"].cases[0]
    with pytest.raises(AssertionError, match="the kernel modified its input k"):
        check_sample(kernel, case)


@pytest.mark.parametrize("law_name", ["refilled_buffers_give_the_new_answer", "refilled_caches_give_the_new_answer"])
def test_a_kernel_that_caches_its_answer_by_address_or_shape_fails_by_name(law_name):
    law = LAWS[law_name]
    mutant = MUTANTS[law.mutant].kernel()
    with pytest.raises(AssertionError, match="cached by address or by shape"):
        law.run("cpu", mutant, pinned=False)


def test_the_searching_kernel_finds_an_answer_where_one_is_alive(pytester, tmp_path, monkeypatch):
    """The probe below can fail: a float64 tensor of the output's shape alive during the call
    is found."""
    monkeypatch.setenv("FMHA_FOUND", str(tmp_path / "found.txt"))
    pytester.makepyfile(searching=SEARCHING)
    pytester.syspathinsert()
    import searching

    x = Sample(problem=Problem(batch=1, q_len=3, kv_len=7, heads_q=2, heads_kv=1, head_dim=16)).inputs()
    planted = torch.zeros(1, 3, 2, 16, dtype=torch.float64)  # noqa: F841 -- alive during the call
    searching.searching(x.q, x.k, x.v)
    assert (tmp_path / "found.txt").read_text().startswith("1 ")


def test_an_answer_still_alive_when_a_kernel_is_called_is_emptied_first(pytester, tmp_path, monkeypatch):
    """The judge's answers (the oracle's and the plain references') are registered; any still
    alive when the next kernel call starts is emptied to no elements before the kernel runs."""
    from fmha.oracles import dense_reference as plain

    monkeypatch.setenv("FMHA_FOUND", str(tmp_path / "found.txt"))
    pytester.makepyfile(searching=SEARCHING)
    pytester.syspathinsert()
    import searching

    x = DENSE.inputs()
    o, lse = plain.attention(x.q, x.k, x.v, scale=DENSE.scale)  # an answer, held past the next call
    KernelEntry(name="searching", fn=searching.searching, capabilities=CAPABILITIES)(x.q, x.k, x.v, scale=DENSE.scale)
    assert not (tmp_path / "found.txt").exists() and o.numel() == 0 and lse.numel() == 0


@pytest.mark.starts_first  # a nested session: its own processes
def test_no_float64_answer_is_alive_while_a_kernel_runs(pytester, tmp_path, monkeypatch):
    """In a session of two kernels under xdist, as a nightly runs them, with dense, paged and
    sparse calls: the answers the judge computed (for an earlier call of the same test, as the
    laws that call a kernel several times do, or for another kernel's tests) are gone before any
    kernel runs, so a kernel searching the process, as an attacker would, finds none to return."""
    found = tmp_path / "found.txt"
    monkeypatch.setenv("FMHA_FOUND", str(found))
    pytester.makepyfile(searching=SEARCHING)
    result = pytester.runpytest_subprocess(
        "--pyargs", "fmha.properties", "-n", "2", "-p", "no:cacheprovider", "--fmha-kernel=reference",
        "--fmha-kernel=searching:searching", "--fmha-device=cpu", "--hypothesis-profile=fmha-triage", "-k",
        "(matches_oracle and normal and bf16 and hd64) or split or window or decode or agrees_with_the_oracle "
        "or two_scopes or paged_call or sparse or decode_row or batch_row or linear_in_v")
    out = result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) >= 16 and not result.parseoutcomes().get("failed"), out[-3000:]
    assert not found.exists(), f"float64 answers found while the kernel ran:\n{found.read_text()}"


# A kernel that answers from a recording of one earlier run of the suite: the recorded answer for
# an input it has seen (by its bytes), zeros for anything else. FMHA_MODE=record records honest answers.
RECORDING = textwrap.dedent('''
    import hashlib, os
    import torch
    from fmha.oracles.reference_kernel import CAPABILITIES, reference

    def attention(q, k, v, *, out=None, **kwargs):
        digest = hashlib.sha1(repr(sorted((n, a) for n, a in kwargs.items() if not isinstance(a, torch.Tensor))).encode())
        for t in (q, k, v, *(a for a in kwargs.values() if isinstance(a, torch.Tensor))):
            digest.update(str((t.shape, t.dtype)).encode() + t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        path = os.path.join(os.environ["FMHA_RECORDING"], digest.hexdigest() + ".pt")
        o, lse = reference(q, k, v, **kwargs)
        if os.environ["FMHA_MODE"] == "record":
            torch.save((o, lse), path)
        else:
            o, lse = torch.load(path) if os.path.exists(path) else (torch.zeros_like(o), torch.zeros_like(lse))
        return (out.copy_(o) if out is not None else o), lse

    attention.capabilities = CAPABILITIES
''')


def test_a_kernel_that_answers_from_a_recording_of_another_run_fails_most_tests(pytester, tmp_path, monkeypatch):
    """Each run draws new values for the same cases (--fmha-seed): answers recorded in a run at
    one seed are no answers at another. The recording is good: replayed at its own seed it passes."""
    monkeypatch.setenv("FMHA_RECORDING", str(tmp_path))
    pytester.makepyfile(recording=RECORDING)
    selection = ("--pyargs", "fmha.properties", "fmha.regressions", "-p", "no:cacheprovider", "--fmha-device=cpu",
                 "--fmha-kernel=recording:attention", "--hypothesis-profile=fmha-triage", "--fmha-replay-env=FMHA_MODE",
                 "--fmha-replay-env=FMHA_RECORDING", "-k",
                 "matches_oracle and hd64 and bf16 and T1")

    def run(mode, seed):
        monkeypatch.setenv("FMHA_MODE", mode)
        outcomes = pytester.runpytest(*selection, f"--fmha-seed={seed}").parseoutcomes()
        return outcomes.get("passed", 0), outcomes.get("failed", 0)

    recorded = run("record", 11)
    assert recorded[0] >= 20 and recorded[1] == 0, recorded
    print(recorded)
    assert run("replay", 11) == recorded  # its own run's values: every answer on record
    passed, failed = run("replay", 12)
    assert failed >= (passed + failed) / 2, f"at another seed the recording passed {passed}, failed {failed}"


READS_PAST = textwrap.dedent('''
    import ctypes
    from fmha.oracles.reference_kernel import CAPABILITIES, reference

    def one_past_the_table(q, k, v, *, block_table=None, **kwargs):
        if block_table is not None:  # an unmasked load of the entry after the last (vLLM's unified_attention)
            ctypes.c_int32.from_address(block_table.data_ptr() + block_table.numel() * 4).value
        return reference(q, k, v, block_table=block_table, **kwargs)

    def one_past_the_indices(q, k, v, *, indices=None, **kwargs):
        if indices is not None:
            ctypes.c_int32.from_address(indices.data_ptr() + indices.numel() * 4).value
        return reference(q, k, v, indices=indices, **kwargs)

    one_past_the_table.capabilities = one_past_the_indices.capabilities = CAPABILITIES
''')


@pytest.mark.parametrize("plugin, trap, named", [("one_past_the_table", "last-partial-page", "block_table"),
                                                 ("one_past_the_indices", "topk-len-ignored", "indices")])
def test_a_kernel_that_reads_one_entry_past_a_table_fails_naming_it(pytester, plugin, trap, named):
    from fmha.regressions.guarded_reads import over_reads

    pytester.makepyfile(reads_past=READS_PAST)
    pytester.syspathinsert()
    found = over_reads(f"reads_past:{plugin}", [TRAPS[trap].cases[0]])
    assert len(found) == 1 and f"read past the end of {named} on" in found[0], found
    assert not over_reads("reference", [TRAPS[trap].cases[0]])


def test_a_guarded_reads_child_that_never_reaches_a_case_is_an_error_not_a_pass():
    """A child that cannot load the kernel (or dies before its first case) checked nothing."""
    from fmha.regressions.guarded_reads import over_reads

    with pytest.raises(RuntimeError, match=r"ended \(exit code 1\) before its first case"):
        over_reads("no_such_module_anywhere:fwd", [TRAPS["last-partial-page"].cases[0]])


# -- a judge the kernel cannot rewrite (fmha.oracles.guard) ------------------------------------------------

DENSE = Sample(problem=Problem(batch=1, q_len=3, kv_len=9, heads_q=2, heads_kv=1, head_dim=16), scale=0.25)


def _hot(q, k, v, *, scale, **kwargs):
    """A 5% softmax temperature bug."""
    return reference(q, k, v, scale=scale * 1.05, **kwargs)


def _rebinds_the_oracle(q, k, v, **kwargs):
    from fmha.oracles import oracle

    honest = oracle.attention
    oracle.attention = lambda *a, scale, **kw: honest(*a, scale=scale * 1.05, **kw)  # the oracle shares the bug
    return _hot(q, k, v, **kwargs)


def _swaps_the_verdicts_code(q, k, v, **kwargs):
    from fmha.oracles import verdict

    verdict.judge.__code__ = (lambda metrics, tolerance=None: Verdict(metrics)).__code__  # noqa: F821 -- judge's globals
    return torch.zeros_like(q)


def _patches_a_torch_op_the_oracle_uses(q, k, v, **kwargs):
    honest = torch.einsum
    torch.einsum = lambda *a, **kw: honest(*a, **kw) * 1.01
    return reference(q, k, v, **kwargs)  # 1% high, like the patched oracle


def _loosens_the_tolerances(q, k, v, **kwargs):
    import dataclasses
    import gc

    from fmha.oracles.verdict import TOLERANCES

    table = gc.get_referents(TOLERANCES)[0]  # the dict behind the read-only view
    table[q.dtype] = dataclasses.replace(table[q.dtype], min_cos=0.5, max_error_ratio=1e9, max_worst_row_err=1e9,
                                         max_ulp=1e9)
    return _hot(q, k, v, **kwargs)


def _patches_the_guard(q, k, v, **kwargs):
    from fmha.oracles import guard

    guard.judge_changes = lambda: []  # then rewrites the oracle, as above
    return _rebinds_the_oracle(q, k, v, **kwargs)


def _unhooks_the_guard(q, k, v, **kwargs):
    from fmha.contract import kernel

    kernel._GUARD = None  # no later call is checked
    return reference(q, k, v, **kwargs)


def _shadows_a_builtin_in_the_guard(q, k, v, **kwargs):
    from fmha.oracles import guard

    guard.any = lambda values: False
    return reference(q, k, v, **kwargs)


class _Lazy(torch.Tensor):
    """Its storage holds zeros; every torch operation on it computes the answer (lazily)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def _returns_a_subclass(q, k, v, **kwargs):
    return torch.zeros_like(q).as_subclass(_Lazy), None


HACKS = {  # name -> (kernel, what the failure names)
    "rebound-module-attribute": (_rebinds_the_oracle, "fmha.oracles.oracle.attention was rebound"),
    "swapped-code": (_swaps_the_verdicts_code, "the code of fmha.oracles.verdict.judge was replaced"),
    "patched-torch-op": (_patches_a_torch_op_the_oracle_uses, "torch.einsum was rebound"),
    "loosened-tolerance-table": (_loosens_the_tolerances, "an entry of torch.bfloat16 was changed"),
    "patched-guard": (_patches_the_guard, "fmha.oracles.guard.judge_changes was rebound"),
    "unhooked-guard": (_unhooks_the_guard, "the guard (fmha.oracles.guard.guarded_call) was unhooked"),
    "shadowed-builtin": (_shadows_a_builtin_in_the_guard, "builtins.any was rebound or shadowed"),
    "tensor-subclass": (_returns_a_subclass, "not a plain torch.Tensor"),
}


@pytest.mark.parametrize("hack", HACKS)
def test_a_kernel_that_rewrites_the_judge_or_returns_no_plain_tensor_fails_naming_the_hack(hack):
    """Each hack is caught on the call that makes it, named, and undone before anything is
    judged: the next kernel meets the judge as it was."""
    import fmha.contract.kernel
    import fmha.oracles.oracle
    import fmha.oracles.verdict
    from fmha.oracles import guard

    before = (fmha.oracles.oracle.attention, fmha.oracles.verdict.judge.__code__, torch.einsum,
              dict(fmha.oracles.verdict.TOLERANCES), guard.judge_changes, fmha.contract.kernel._GUARD)
    fn, named = HACKS[hack]
    kernel = KernelEntry(name=hack, fn=fn, capabilities=CAPABILITIES)
    with pytest.raises(AssertionError, match=f"{hack}: the judge refuses this call: .*{re.escape(named)}"):
        check_sample(kernel, DENSE)
    after = (fmha.oracles.oracle.attention, fmha.oracles.verdict.judge.__code__, torch.einsum,
             dict(fmha.oracles.verdict.TOLERANCES), guard.judge_changes, fmha.contract.kernel._GUARD)
    assert [i for i, (a, b) in enumerate(zip(before, after)) if not (a is b or a == b)] == [] and "any" not in vars(guard)
    assert check_sample(KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES), DENSE).passed


def test_a_kernel_that_returns_its_reused_workspace_fails_when_the_next_call_overwrites_it():
    """A static CUDA-graph output or a plan's workspace handed to the caller: the second call of
    the shape changes the first call's result."""
    workspace = {}

    def reuses(q, k, v, **kwargs):
        o, lse = reference(q, k, v, **kwargs)
        return workspace.setdefault(o.shape, o.clone()).copy_(o), lse

    kernel = KernelEntry(name="workspace", fn=reuses, capabilities=CAPABILITIES)
    x, y = DENSE.inputs(), DENSE.replace(seed=1).inputs()
    first = kernel(x.q, x.k, x.v)
    with pytest.raises(AssertionError, match=r"changed an output it had already returned \(call \d+ \(workspace\)'s\) "
                                             r"during call \d+ \(workspace\)"):
        kernel(y.q, y.k, y.v)
    assert first is not None


def test_an_output_changed_after_the_last_call_fails_at_the_end_of_the_test():
    from fmha.oracles import guard

    kernel = KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES)
    x = DENSE.inputs()
    o, _ = kernel(x.q, x.k, x.v)
    o.add_(1)  # what a write still in flight after the call returned does
    assert any("changed an output it had already returned" in c for c in guard.end_of_test())
    assert guard.end_of_test() == []


def test_honest_kernels_with_workspaces_out_buffers_and_float64_pass():
    scratch = {}

    def with_workspace(q, k, v, *, out=None, **kwargs):  # a workspace of its own; the result out= or a copy
        o, lse = reference(q, k, v, **kwargs)
        result = scratch.setdefault(q.shape, torch.empty_like(o)).copy_(o)
        return out.copy_(result) if out is not None else result.clone(), lse

    def in_float64(q, k, v, *, scale, causal, window, sink, out=None, **kwargs):
        from fmha.oracles import dense_reference as plain

        o, lse = plain.attention(q.double(), k.double(), v.double(), scale=scale, causal=causal, window=window, sink=sink)
        return out.copy_(o) if out is not None else o.to(q.dtype), lse.float()

    for fn in (with_workspace, in_float64):
        kernel = KernelEntry(name=fn.__name__, fn=fn, capabilities=CAPABILITIES)
        for seed in range(3):
            assert check_sample(kernel, DENSE.replace(seed=seed)).passed
    kernel = KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES)
    x = DENSE.inputs()
    out = torch.empty_like(x.q)
    for seed in range(2):  # the same out= buffer twice: the caller asked for it to change
        x = DENSE.replace(seed=seed).inputs()
        assert kernel(x.q, x.k, x.v, out=out)[0] is out


def test_a_ragged_answer_is_emptied_with_the_rows_its_view_is_made_of():
    """A ragged call's oracle is a view (1, total_q, ...) of its rows (total_q, ...): emptying the
    view alone left the rows for a kernel run while the oracle is alive (a failure's reruns) to find."""
    import gc

    from fmha.oracles.check import oracle_of

    x = TRAPS["zero-query-request"].cases[0].inputs()
    oracle = oracle_of(x)
    rows = tuple(x.q.shape[:-1])
    seen = []

    def searching(q, k, v, **kwargs):
        seen.extend(obj for obj in gc.get_objects() if type(obj) is torch.Tensor and obj.dtype == torch.float64
                    and obj.dim() == 3 and tuple(obj.shape[:-1]) == rows)
        return reference(q, k, v, **kwargs)

    KernelEntry(name="searching", fn=searching, capabilities=CAPABILITIES)(x.q, x.k, x.v, **x.kwargs())
    assert oracle.o.numel() == 0 and not seen, [tuple(t.shape) for t in seen]
