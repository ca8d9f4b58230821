"""zero-query-request: in a ragged batch, a request with no query rows before decode requests
gives those decodes wrong rows, or leaves them unwritten. vLLM's Triton `unified_attention`
shipped it: its decode-only launch took program i to be the i-th decode, so a request with no
rows shifted every request after it onto another request's keys."""

from fmha.regressions.paged_cases import PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

DECODES = PAGED.replace(batch=4, q_len=1, ragged=True)

TRAP = Trap(
    id="zero-query-request", seed_logs=(),
    source="vLLM's Triton unified_attention through the paged call (reproduced on CPU and an H200)",
    symptom="the decodes after a request with no query rows come out wrong, or unwritten",
    root_cause="requests with no query rows dropped from the launch: program i reads the i-th request's keys",
    cases=(reproducer(DECODES, kv_lens=(9, 6, 5, 8), q_lens=(0, 1, 1, 1), seed=2, why="the first request has no rows"),
           reproducer(DECODES, kv_lens=(4, 9, 2, 7), q_lens=(1, 0, 1, 1), seed=5, why="no rows between decodes")),
)

MUTANTS = proving(TRAP.id)
