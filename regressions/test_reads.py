"""Nothing outside a call's tensors is read: a paged or sparse named case of each trap, laid out
for the kernel, with an exactly sized block table and each of its tensors against a guard page,
runs in a child process (regressions/guarded_reads.py). The CPU tier's check; on GPUs
`python -m fmha.ci.sanitize` runs the same cases under compute-sanitizer's memcheck."""

import pytest

from fmha.regressions.guarded_reads import over_reads
from fmha.regressions.traps import laid_out_cases

pytestmark = pytest.mark.regression


def test_nothing_past_the_calls_tensors_is_read(kernel, device):
    if device != "cpu":
        pytest.skip("guard pages guard host memory: on GPUs, python -m fmha.ci.sanitize checks the same cases")
    if not kernel.capabilities_on(device).sources & {"paged", "sparse"}:
        pytest.skip(f"{kernel.name}: no paged or sparse source (Capabilities.sources): nothing to read past")
    first = {}  # a case of each paged or sparse trap that the kernel runs
    for trap_id, case in laid_out_cases(kernel, device):
        if case.problem.source != "dense":
            first.setdefault(trap_id, case)
    samples = list(first.values())
    if not samples:
        pytest.skip(f"{kernel.name}: none of the paged or sparse named cases can be laid out for it")
    found = over_reads(kernel.name, samples)
    assert not found, "\n".join(found)
