"""Contract v2's metamorphic laws (properties/source_laws.py), each its own test, for every
selected kernel that declares a paged or index-sparse source; the others skip, saying so."""

import pytest

from fmha.ci.plugin import law_settings, reproduce_command
from fmha.properties import laws, source_laws
from fmha.properties.source_strategies import source_samples

pytestmark = pytest.mark.property


def _check(law, kernel, device, request):
    test, kinds, needs = source_laws.SOURCE_LAWS[law]
    assert test == request.node.originalname, "source_laws.SOURCE_LAWS is out of date"
    source_laws.require(kernel, device, kinds, needs)
    laws.run_law(law, source_samples(kernel.capabilities_on(device), device, kinds=kinds, needs=needs), kernel,
                 device=device, reproduce=reproduce_command(request.node), settings=law_settings(request.config))


def test_moving_physical_pages_changes_nothing(kernel, device, request):
    _check(source_laws.pages_permuted_change_nothing, kernel, device, request)


def test_unread_slots_pages_and_bytes_leak_nothing(kernel, device, request):
    _check(source_laws.unread_storage_leaks_nothing, kernel, device, request)


def test_an_invalid_index_equals_its_absence(kernel, device, request):
    _check(source_laws.an_invalid_index_equals_its_absence, kernel, device, request)


def test_a_paged_request_alone_equals_its_rows_in_the_batch(kernel, device, request):
    _check(source_laws.a_request_alone_equals_its_rows_in_the_batch, kernel, device, request)


def test_two_scopes_equal_the_merge_of_each_scope(kernel, device, request):
    _check(source_laws.two_scopes_equal_the_merge_of_each, kernel, device, request)


def test_another_block_size_changes_nothing(kernel, device, request):
    _check(source_laws.block_size_changes_nothing, kernel, device, request)


def test_reordering_a_rows_indices_changes_nothing(kernel, device, request):
    _check(source_laws.index_order_changes_nothing, kernel, device, request)


def test_sparse_rows_over_their_keys_equal_the_dense_call(kernel, device, request):
    _check(source_laws.sparse_over_its_keys_equals_dense, kernel, device, request)
