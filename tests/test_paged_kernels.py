"""Contract v2 end to end on the CPU: samples (paged, ragged, index-sparse, two scopes,
quantized caches) through a kernel and the verdict. The reference kernel, fmha's
(fmha.kernels.triton_paged, interpreted) and the gather-then-SDPA adapter pass, and the reference
passes every v2 named case (fmha's own run of them: regressions/test_traps.py). The kernels with
the bugs paged and sparse kernels have shipped fail those cases: tests/test_kill_matrix.py,
the diagonal (each v2 trap's cases on its mutant)."""

import pytest
import torch

from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.regressions.paged_cases import PAGED, SPARSE, TWO_SCOPES
from fmha.regressions.trap import check_case
from fmha.regressions.traps import TRAPS
from fmha.registry import KERNELS

SAMPLES = {
    "paged": Sample(problem=PAGED, kv_lens=(9, 0, 5), shared_pages=True, seed=1),
    "paged-window": Sample(problem=PAGED.replace(window=3, dtype=torch.float16), kv_lens=(6, 9, 1), seed=2),
    "ragged": Sample(problem=PAGED.replace(ragged=True), kv_lens=(9, 3, 5), q_lens=(2, 0, 1), seed=3),
    "paged-block1": Sample(problem=PAGED.replace(block_size=1, dtype=torch.float32), kv_lens=(2, 9, 4), seed=4),
    "paged-block5": Sample(problem=PAGED.replace(block_size=5), kv_lens=(9, 7, 3), seed=7),
    # Past KEYS_PER_SPLIT (256 interpreted): split, merged with the sink; the short request's
    # later splits are empty, a window's leaves the first ones empty.
    "paged-split": Sample(problem=PAGED.replace(kv_len=700, block_size=64, sink=True), kv_lens=(700, 40, 300), seed=8),
    "paged-split-window": Sample(problem=PAGED.replace(kv_len=600, block_size=16, window=50, ragged=True),
                                 kv_lens=(600, 0, 270), q_lens=(2, 1, 2), seed=9),
    "sparse": Sample(problem=SPARSE, topk_lens=(6, 3), invalid=0.25, seed=5),
    "two-scopes": Sample(problem=TWO_SCOPES, topk_lens=(6, 0), extra_topk_lens=(4, 2), invalid=0.5, seed=6),
}


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("kernel_name", ["reference", "fmha"])
def test_the_reference_and_fmha_kernels_pass(kernel_name, name):
    verdict = check_sample(KERNELS[kernel_name], SAMPLES[name])
    assert verdict.passed, verdict.message(name)


@pytest.mark.parametrize("name", [n for n in SAMPLES if SAMPLES[n].problem.source == "paged"])
def test_gathering_the_pages_then_sdpa_passes(name):
    verdict = check_sample(KERNELS["sdpa-paged"], SAMPLES[name])
    assert verdict.passed, verdict.message(name)


V2_CASES = [(trap, case) for trap in TRAPS.values() for case in trap.cases if case.problem.source != "dense"]


@pytest.mark.parametrize("trap, case", V2_CASES, ids=[f"{t.id}/{c.id}" for t, c in V2_CASES])
def test_the_reference_kernel_passes_every_contract_v2_named_case(trap, case):
    """The correct kernel the v2 traps are proven against (their mutants fail them:
    tests/test_kill_matrix.py)."""
    failures = check_case(KERNELS["reference"], case, "cpu", trap.symptoms)
    assert not failures, f"{trap.id}/{case.id}: {failures}"
