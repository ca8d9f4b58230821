"""The hazard table (fmha.oracles.hazards) drives the draws: every hazard is drawn by the covering
set on every run (for two seeds), every hostile draw carries every layout hazard its problem
allows, each hazard has a mutant that it alone exposes, a failing hostile draw names the hazard
it needs, and docs/contract.md's table is the records'."""

import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fmha.oracles import run_seed, storage
from fmha.oracles.run_seed import FIXED
from fmha.oracles.hazards import HAZARDS, applicable, invisible_keys, markdown, present
from fmha.properties import covering, covering_array
from fmha.properties.catalog import LAWS
from fmha.properties.paged_strategies import paged_samples
from fmha.regressions.mutants import MUTANTS
from fmha.regressions.selection import resolve_kernel
from fmha.registry import KERNELS

if sys.version_info < (3, 11):  # hypothesis brings the backport there
    from exceptiongroup import BaseExceptionGroup

pytestmark = pytest.mark.cpu_tier  # reference-based kernels on the CPU: nightly on CUDA
pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "contract.md"
LAW_TESTS = str(Path(__file__).resolve().parents[1] / "properties" / "test_laws.py")
REFERENCE = KERNELS["reference"]
AGREEMENT = {law.name: law for law in LAWS.values() if law.covering == "family"}  # the families' laws


@pytest.mark.parametrize("seed", [0, 1])
def test_the_covering_set_draws_every_hazard_and_every_interacting_pair(seed):
    samples = covering.covering_samples(REFERENCE, "cpu", seed)
    assert not covering.uncovered(samples), f"seed {seed}: not drawn: {covering.uncovered(samples)}"


@pytest.mark.parametrize("seed", [FIXED, 77, 244, "this run's"])
def test_each_covering_sample_carries_every_hazard_its_problem_allows(seed):
    """At any run seed: by construction, not by the dice. Run seed 77 once drew a few-key sparse
    row with no repeated index; 244, two fp4 codes written into one byte, one of them lost."""
    for sample in covering.covering_samples(REFERENCE, "cpu"):
        sample = sample.replace(run_seed=run_seed.current() if seed == "this run's" else seed)
        assert not _missing_hazards(sample), f"{sample.id}: applies but not in its bytes: {_missing_hazards(sample)}"


def test_each_covering_array_call_carries_every_hazard_its_problem_allows():
    """The covering array's calls (properties/covering_array.py) are hostile as the set's are, at
    this run's seed: poison where a kernel must not read, shared pages, full and partial last
    pages, rows and requests without keys or rows where declared, every code of a quantized cache."""
    for sample in covering_array.array(REFERENCE, "cpu", seed=11):
        assert not _missing_hazards(sample), f"{sample.id}: applies but not in its bytes: {_missing_hazards(sample)}"


def _missing_hazards(sample) -> list[str]:
    """Hazards `sample`'s problem allows that its bytes do not carry."""
    missing = set(applicable(sample.problem, REFERENCE.capabilities)) - set(present(sample.inputs())) - sample.given_up
    scopes = 2 if sample.problem.extra_topk is not None else 1
    given = [lengths is not None for lengths in (sample.topk_lens, sample.extra_topk_lens)][:scopes]
    if sample.problem.source == "sparse":
        # a scope passed without its lengths argument is read whole (each scope's topk_len is
        # optional on its own: fmha.contract.relations): every row sees its keys, and with
        # neither argument every request reads both scopes
        missing -= {"rows-without-keys"} if not all(given) else set()
        missing -= {"one-scope-empty"} if not any(given) else set()
    return sorted(missing)


def test_each_covering_sample_belongs_to_one_agreement_law():
    for sample in covering.covering_samples(REFERENCE, "cpu"):
        laws = [law.name for law in AGREEMENT.values() if covering.fits(law, sample)]
        assert len(laws) == 1, f"{sample.id}: {laws}"


def test_a_kernel_that_opts_out_is_not_drawn_the_hazard():
    """A kernel declaring empty_query_requests=False gets no request without rows in its
    covering samples (its opt-out), and still every other hazard."""
    import dataclasses

    from fmha.contract import KernelEntry

    caps = dataclasses.replace(REFERENCE.capabilities, empty_query_requests=False, empty_rows=False)
    kernel = KernelEntry(name="no-empty", fn=REFERENCE.fn, capabilities=caps)
    carried = set().union(*(present(s.inputs()) for s in covering.covering_samples(kernel, "cpu")))
    assert "zero-query-requests" not in carried and "rows-without-keys" not in carried
    assert {"invisible-keys", "wide-block-table", "padded-pages", "every-code"} <= carried


@settings(max_examples=15, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(sample=paged_samples(REFERENCE.capabilities))
def test_a_hostile_draw_carries_every_layout_hazard_of_its_problem(sample):
    layout = set(applicable(sample.problem, kinds=("layout",)))
    assert set(sample.hazards) == layout
    carried = set(present(sample.inputs()))
    # every-code needs 254 element positions among the keys some row reads; a run of -1 valid
    # indices after it: neither where every index is -1
    no_key_read = sample.invalid == 1.0 or (sample.kv_lens is not None and not any(sample.kv_lens))
    unread = {"every-code", "invalid-runs"} if no_key_read else {"every-code"}
    # no key invisible to every row: a window as wide as the keys, or hidden keys only in the first
    # page, which requests share (another's rows see it)
    p = sample.problem
    hidden = [invisible_keys(q, kv, p.window) for q, kv in zip(*sample.request_lengths())]
    if not any(hidden) or (sample.shared_pages and all(h <= p.block_size for h in hidden)):
        unread.add("invisible-keys")
    assert layout - unread - sample.given_up <= carried, f"{sample.id}: {sorted(layout - carried)}"


def test_every_hazard_names_a_mutant_of_the_registry():
    missing = {name: h.mutant for name, h in HAZARDS.items() if h.mutant not in MUTANTS}
    assert not missing, missing
    sequences = {h.exercised_by for h in HAZARDS.values() if h.kind == "sequence"}
    assert sequences <= set(LAWS), sequences - set(LAWS)


def test_each_storage_hazard_is_a_form_its_arguments_records_allow():
    """A storage hazard is freedoms of its arguments' records (fmha.contract.arguments), laid out
    by the function every storage draw uses: what the records cannot express, no hazard draws."""
    problems = [s.problem for s in covering.covering_samples(REFERENCE, "cpu")
                if s.problem.source != "dense" and not s.problem.cache_layouts]
    assert {p.source for p in problems} == {"paged", "sparse"} and any(p.ragged for p in problems)
    storage_hazards = {name: h.form for name, h in HAZARDS.items() if h.form[0]}
    assert {"wide-block-table", "padded-pages", "strided-queries"} <= set(storage_hazards), storage_hazards
    for name, (arguments, form) in storage_hazards.items():
        for argument in arguments:
            for problem in problems:
                assert storage.forms(form, storage.record(argument, problem)), (name, argument)
    with pytest.raises(ValueError, match="not among its freedoms"):
        storage.forms("step:Hq", storage.record("block_table", problems[0]))  # the check can fail


REMOVABLE = [name for name, h in HAZARDS.items() if h.kind in ("layout", "draw", "magnitude")]


@pytest.mark.parametrize("hazard", REMOVABLE)
def test_each_hazard_exposes_its_mutant_and_without_it_the_mutant_passes(hazard):
    """On a covering sample that carries the hazard, its mutant fails the sample's agreement law;
    on the same sample without the hazard, it passes: the hazard, not luck, catches it."""
    mutant = resolve_kernel(f"mutant:{MUTANTS[HAZARDS[hazard].mutant].name}")
    samples = [s for s in covering.covering_samples(mutant, "cpu") if hazard not in s.given_up  # whole, not
               and hazard in present(s.inputs())                      # what a storage form left of it
               and hazard not in present(HAZARDS[hazard].remove(s).inputs())]  # not a form's by-product
    assert samples, f"no covering sample carries {hazard}"
    sample = samples[0]
    law = next(law for law in AGREEMENT.values() if covering.fits(law, sample))
    with pytest.raises(AssertionError):
        law.check(mutant, sample, "cpu")
    law.check(mutant, HAZARDS[hazard].remove(sample), "cpu")


def test_out_is_a_view_into_poison_and_a_kernel_writing_it_packed_fails():
    """Every call with out= hands a view with poison around each row (poison-around-out): the
    reference writes through its strides; a kernel that writes at packed offsets is named."""
    from fmha.oracles.kernel_call import run_kernel

    sample = covering.covering_samples(REFERENCE, "cpu")[0]
    run = run_kernel(REFERENCE, sample.inputs())
    assert not run.o.is_contiguous() and not run.unwritten.any()
    with pytest.raises(AssertionError, match="wrote outside out=.*write through its strides"):
        run_kernel(resolve_kernel("mutant:out-assumed-packed"), sample.inputs())


def test_a_failing_hostile_draw_names_the_hazard_it_needs():
    law = LAWS["paged_calls_agree_with_the_oracle"]
    kernel = resolve_kernel("mutant:table-rows-assumed-packed")
    quick = settings(max_examples=2, derandomize=True, database=None, deadline=None)
    with pytest.raises((AssertionError, BaseExceptionGroup)) as caught:  # several distinct failures: each named
        law.run("cpu", kernel, settings=quick)
    notes = "\n".join(note for failure in getattr(caught.value, "exceptions", (caught.value,))
                      for note in getattr(failure, "__notes__", ()))
    assert "hazard: the failure needs wide-block-table" in notes, notes
    assert re.search(r"pin it without the others: @example\(sample=Sample\(.*\)\)", notes), notes


def test_the_hazard_table_in_docs_contract_md_is_the_records():
    page = DOC.read_text()
    table = page.split("<!-- hazards: generated -->\n", 1)[1].split("<!-- hazards: end -->", 1)[0]
    assert table == markdown(), "docs/contract.md's hazard table is out of date: python -m fmha.oracles.hazards"



def test_the_session_ends_with_the_hazards_its_draws_carried(pytester):
    """Counted per hazard; the ones no draw carried are named where an agreement law ran (its
    covering set draws them all), not after a run of one other law."""
    agreement = pytester.runpytest(LAW_TESTS, "-p", "no:cacheprovider", "--fmha-kernel=reference",
                                   "--fmha-device=cpu", "-k", "test_a_paged_call_agrees_with_the_oracle")
    out = agreement.stdout.str()
    assert agreement.parseoutcomes().get("passed") == 1, out[-3000:]
    counts = dict(re.findall(r"([a-z-]+) (\d+)", out.split("fmha: hazards the draws carried: ")[1].splitlines()[0]))
    assert int(counts["wide-block-table"]) >= 1 and int(counts["poison-around-out"]) >= 1, counts
    assert "fmha: no draw carried" in out and "invalid-runs" in out.split("fmha: no draw carried")[1], out[-2000:]
    one_law = pytester.runpytest(LAW_TESTS, "-p", "no:cacheprovider", "--fmha-kernel=reference", "--fmha-device=cpu",
                                 "-k", "test_output_is_linear_in_v")
    assert "fmha: hazards the draws carried" in one_law.stdout.str()
    assert "fmha: no draw carried" not in one_law.stdout.str(), one_law.stdout.str()[-2000:]
