"""The run's seed: what every sample's values are drawn from, besides the sample's own seed.

Each case keeps its structure (its shapes, lengths, hazards, the point of a named case) and
draws its values anew on every run: fixed bytes on every run can be memorized by a generated
kernel, and a kernel that passed once would never be explored again. The seed is chosen per
run (pytest's `--fmha-seed N`, else a fresh one), printed in the session's header and in every
command that reruns a failure, and mixed with the name of the kernel under test, so two
kernels of one session never see the same bytes (one's outputs are no answer for the other).

Seed 0 draws the values a sample drew before runs had seeds: `--fmha-seed 0` is the fixed run,
and processes that set no seed (the kill matrix's rows, fmha's benchmarks) use it.
"""

from __future__ import annotations

import hashlib
import secrets

FIXED = 0
ENVIRONMENT = "FMHA_SEED"  # the run's seed where no --fmha-seed is given; a run sets it for the sessions it starts
_SEED = [FIXED]  # the seed the values of this process's samples are drawn under
__judge_state__ = ("_SEED",)  # fmha.oracles.guard: set by the plugin per test, not a part of what judges


def fresh() -> int:
    """A new run's seed: nonzero, short enough to type."""
    return 1 + secrets.randbelow(2**31 - 1)


def current() -> int:
    return _SEED[0]


def use(seed: int) -> None:
    """Draw this process's samples under `seed` from now on."""
    _SEED[0] = int(seed)


def _mix(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:7], "little")


def for_kernel(run_seed: int, kernel_name: str) -> int:
    """The seed one kernel's tests draw under in the run `run_seed` (the run's seed for FIXED)."""
    return run_seed if run_seed == FIXED else _mix(run_seed, kernel_name)


def values_seed(sample_seed: int, run_seed: int) -> int:
    """The generator seed of a sample's values: the sample's own seed mixed with the run's
    (the sample's own seed alone under FIXED)."""
    return sample_seed if run_seed == FIXED else _mix(run_seed, sample_seed)
