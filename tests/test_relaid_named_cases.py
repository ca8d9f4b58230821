"""A narrow dense kernel gets the dense named cases re-laid inside its declaration (causal for
a causal-only kernel; square, in whole tiles, for a square prefill), wherever the trap's mutant
still fails the re-laid case: the correct kernel passes them, the same kernel with the trap's
bug fails them, and a case whose point the declaration cannot hold is a skip that says so."""

import dataclasses

import pytest
import torch

from fmha.regressions.selection import resolve_kernel
from fmha.regressions.traps import TRAPS, run_named_case

pytestmark = pytest.mark.cpu_tier  # the float64 reference and the interpreted Triton kernel's mutants

CAUSAL_ONLY = dict(requires=frozenset({"causal"}))
# The README's flash_fwd: square causal prefill in tiles of 128, no sink, no window.
SQUARE_TILES = dict(features=frozenset({"causal", "lse", "gqa", "shared_kv"}), requires=frozenset({"causal"}),
                    q_len_equals_kv_len=True, kv_len_multiple_of=128)


def _declared(name: str, **fields):
    kernel = resolve_kernel(name)
    return dataclasses.replace(kernel, capabilities=dataclasses.replace(kernel.capabilities_on("cpu"), **fields),
                               device_capabilities={})


@pytest.mark.parametrize("declaration", [CAUSAL_ONLY, SQUARE_TILES], ids=["causal only", "square tiles of 128"])
@pytest.mark.parametrize("trap", ["gqa-head-mapping", "missing-scale", "normalize-twice"])
def test_a_narrow_kernel_runs_the_dense_cases_re_laid_and_its_bug_fails_them(trap, declaration):
    trap = TRAPS[trap]
    case = trap.cases[0]  # non-causal, T < S: outside both declarations as written
    correct, buggy = _declared("reference", **declaration), _declared(f"mutant:{trap.id}", **declaration)
    assert correct.not_supported_reasons(case.problem, "cpu")
    outcome, message = run_named_case(correct, trap, case, "cpu")
    assert outcome == "passed", message
    outcome, message = run_named_case(buggy, trap, case, "cpu")
    assert outcome == "failed" and ", re-laid for the kernel as " in message, message
    laid = message.split(", re-laid for the kernel as ")[1].split(" ")[0]
    assert "-causal-" in laid, laid
    if declaration is SQUARE_TILES:
        T, S = (int(part[1:]) for part in laid.split("-")[1:3])
        assert T == S and S % 128 == 0, laid


def test_a_case_whose_point_a_causal_mask_hides_is_skipped_saying_so():
    """unmasked-padding's decode row sees every key: made causal, it still does, and keys past S in
    the last tile stay masked by causality, so its mutant passes the re-laid case."""
    trap = TRAPS["unmasked-padding"]
    case = trap.cases[0].replace(dtype=torch.float32)
    outcome, message = run_named_case(_declared("reference", **CAUSAL_ONLY), trap, case, "cpu")
    assert outcome == "skipped" and "the case no longer catches its bug" in message, message
