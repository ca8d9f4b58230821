"""Each of contract v2's laws (properties/source_laws.py) holds for the float64 reference
kernel and catches a kernel with a bug it is made for (regressions/source_mutants.py)."""

import pytest
from hypothesis import HealthCheck, settings

from fmha.properties import laws, source_laws
from fmha.properties.source_strategies import source_samples
from fmha.registry import KERNELS
from fmha.regressions.source_mutants import MUTANTS

pytestmark = pytest.mark.cpu_tier  # eager mutants on the CPU: nightly on CUDA

FIND = settings(max_examples=20, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

CAUGHT_BY = {
    source_laws.pages_permuted_change_nothing: "contiguous_pages",
    source_laws.unread_storage_leaks_nothing: "whole_last_page",
    source_laws.an_invalid_index_equals_its_absence: "minus_one_counts",
    source_laws.a_request_alone_equals_its_rows_in_the_batch: "batch_drops_last_key",
    source_laws.two_scopes_equal_the_merge_of_each: "sink_per_scope",
    source_laws.block_size_changes_nothing: "power_of_two_pages",
    source_laws.index_order_changes_nothing: "last_index_dropped",
    source_laws.sparse_over_its_keys_equals_dense: "last_index_dropped",
}


def _run(law, kernel):
    _, kinds, needs = source_laws.SOURCE_LAWS[law]
    strategy = source_samples(kernel.capabilities_on("cpu"), "cpu", kinds=kinds, needs=needs)
    laws.run_law(law, strategy, kernel, device="cpu", settings=FIND)


def test_every_source_law_has_a_mutant():
    assert set(CAUGHT_BY) == set(source_laws.SOURCE_LAWS)


@pytest.mark.parametrize("law", CAUGHT_BY, ids=lambda law: law.__name__)
def test_the_reference_kernel_keeps_the_law(law):
    _run(law, KERNELS["reference"])


@pytest.mark.parametrize("law", CAUGHT_BY, ids=lambda law: law.__name__)
def test_the_law_catches_its_mutant(law):
    mutant = MUTANTS[CAUGHT_BY[law]]
    with pytest.raises(AssertionError) as caught:
        _run(law, mutant)
    assert mutant.name in str(caught.value), str(caught.value)[:2000]
