"""The contract's metamorphic laws, each its own test, for every selected kernel (and merge).

Samples come from hypothesis, inside each kernel's capabilities (properties/strategies.py);
a failure prints the shrunk sample, a command that reruns it and the @example that pins it.
"""

import pytest

from fmha.ci.plugin import law_settings, reproduce_command
from fmha.properties import laws
from fmha.properties.pinned import PINNED
from fmha.properties.strategies import samples

pytestmark = pytest.mark.property


def _check(law, kernel, device, request, operands=None):
    # Known failures (the ledger, a user's file) name the test; fmha.ci.verify finds it here.
    assert laws.LAW_TESTS[law.__name__] == request.node.originalname, "laws.LAW_TESTS is out of date"
    laws.require(kernel, device, *laws.KERNEL_LAWS[law])
    strategy = samples(kernel.capabilities_on(device), device)
    pinned = [s for s in PINNED.get(law.__name__, []) if not kernel.not_supported_reasons(s.problem, device)]
    laws.run_law(law, strategy, *(operands or (kernel,)), device=device, pinned=pinned,
                 reproduce=reproduce_command(request.node), settings=law_settings(request.config))


def test_agrees_with_the_oracle(kernel, device, request):
    _check(laws.agrees_with_oracle, kernel, device, request)


def test_invisible_keys_and_storage_past_s_do_not_leak(kernel, device, request):
    _check(laws.invisible_keys_do_not_leak, kernel, device, request)


def test_permuting_keys_and_values_together_changes_nothing(kernel, device, request):
    _check(laws.key_permutation_invariant, kernel, device, request)


def test_output_is_linear_in_v(kernel, device, request):
    _check(laws.linear_in_v, kernel, device, request)


def test_gqa_equals_mha_with_repeated_kv_heads(kernel, device, request):
    _check(laws.gqa_equals_mha_with_repeated_kv, kernel, device, request)


def test_k_is_v_equals_separate_copies(kernel, device, request):
    _check(laws.k_is_v_equals_copies, kernel, device, request)


def test_a_batch_row_alone_equals_the_row_in_the_batch(kernel, device, request):
    _check(laws.batch_rows_independent, kernel, device, request)


def test_two_runs_give_the_same_answer(kernel, device, request):
    _check(laws.deterministic, kernel, device, request)


def test_decode_row_equals_the_last_prefill_row(kernel, device, request):
    _check(laws.decode_row_equals_last_prefill_row, kernel, device, request)


def test_sink_minus_infinity_equals_no_sink(kernel, device, request):
    _check(laws.minus_infinity_sink_is_no_sink, kernel, device, request)


def test_window_at_least_s_equals_causal(kernel, device, request):
    _check(laws.window_at_least_s_is_causal, kernel, device, request)


def test_keys_split_anywhere_and_merged_equal_all_keys(kernel, merge_kernel, device, request):
    _check(laws.split_keys_merge_to_the_whole, kernel, device, request, operands=(kernel, merge_kernel))


def test_merge_is_commutative_associative_and_idempotent_up_to_ln2(merge_kernel, device, request):
    from fmha.capabilities import FULL_CONTRACT
    # The merge's work is B x T x H x Dv; S only sizes the float64 oracle that makes the parts.
    # Smaller T and S keep the CPU tier quick without changing what the merge sees.
    limits = dict(max_q_len=64, max_kv_len=256) if device == "cpu" else {}
    strategy = samples(FULL_CONTRACT, device, **limits)
    laws.run_law(laws.merge_algebra, strategy, merge_kernel, device=device, pinned=PINNED.get("merge_algebra", []),
                 reproduce=reproduce_command(request.node), settings=law_settings(request.config))
