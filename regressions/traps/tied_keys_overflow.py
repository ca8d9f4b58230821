"""tied-keys-overflow: a one-pass softmax holds sum(exp(s - max) v) unnormalised in fp32; keys
tied at a row's max each add a weight of 1, so a hundred of them with values near 3e36 (a
quantized cache at tile scale 2^96 with an outlier channel, which also makes their logits tie)
sum past fp32's 3.4e38, and the row comes back NaN though its answer is finite."""

import dataclasses

from fmha.properties.pinned import TIED_KEYS
from fmha.regressions.mutation import Mutant, patched_paged_kernel
from fmha.regressions.trap import Trap

TRAP = Trap(
    id="tied-keys-overflow", seed_logs=(),
    source=("fmha's own kernels (gluon-sparse, cuda-sparse, triton-paged) on an H100, found by the property "
            "suite (the index-reordering law, --fmha-seed 20261213): a hundred fp8 keys at scale 2^96 tied"),
    symptom="NaN in the value columns of an outlier channel where the float64 oracle is finite (and small: the "
            "tied keys' weight is all but 0 beside the other scope's)",
    root_cause="the unnormalised accumulator sum(exp(s - max) v) overflows fp32 before the division by the sum: "
               "each key tied at the max adds 1 x v (fmha.kernels.triton_utils.renormalize holds it at 2^-e)",
    # The laws' pinned sample, values and all (run_seed): the ties come from the keys quantizing to
    # the same codes, which about one run's values in ten split into groups too small to overflow.
    cases=(dataclasses.replace(TIED_KEYS, name="128 fp8 keys at scale 2^96 turned away from q, one code each, "
                                               "their logits tied"),),
)

MUTANTS = (
    Mutant("tied-keys-overflow", TRAP.id, "holds the unnormalised accumulator at 2^0 (no renormalization)",
           lambda: patched_paged_kernel("tied-keys-overflow", ("    if RENORMALIZE:\n", "    if False:\n"))),
)
