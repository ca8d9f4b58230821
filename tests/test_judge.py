"""The judge cannot be gamed by a kernel that does not compute the answer: one that changes its
inputs, one that returns an answer it cached by address or shape, one that returns a float64
answer it found among the process's objects. Each fails a test named for it (or finds nothing
to return)."""

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
        shape = (*q.shape[:-1], v.shape[-1]) if kwargs.get("block_table") is None and kwargs.get("indices") is None else None
        found = [obj for obj in gc.get_objects() if type(obj) is torch.Tensor and obj.dtype == torch.float64
                 and shape is not None and tuple(obj.shape[-len(shape):]) == shape]
        if found:
            with open(os.environ["FMHA_FOUND"], "a") as log:
                log.write(f"{len(found)} {shape}\\n")
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


@pytest.mark.starts_first  # a nested session: its own process
def test_no_float64_answer_is_alive_while_a_kernel_runs(pytester, tmp_path, monkeypatch):
    """The agreement tests, the grid and the laws that compute float64 answers beside their
    kernel calls (split keys, windows, two scopes, decode) compute them only after the kernel
    returns: a kernel searching the process finds none to return."""
    found = tmp_path / "found.txt"
    monkeypatch.setenv("FMHA_FOUND", str(found))
    pytester.makepyfile(searching=SEARCHING)
    result = pytester.runpytest_subprocess(
        "--pyargs", "fmha.properties", "-p", "no:cacheprovider", "--fmha-kernel=searching:searching",
        "--fmha-device=cpu", "--hypothesis-profile=fmha-triage", "-k",
        "(matches_oracle and normal and bf16 and hd64) or split or window or decode or test_agrees_with_the_oracle "
        "or two_scopes_equal")
    out = result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) >= 8, out[-3000:]
    assert not found.exists(), f"float64 answers found while the kernel ran:\n{found.read_text()}"


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
