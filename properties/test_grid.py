"""Every selected kernel agrees with the oracle on the 72-config grid, in MHA, GQA and
MQA-with-K-is-V layouts (ids such as hd512-T4-S640-mqa)."""

import pytest

from oracles.check import check_kernel
from properties.grid import GRID, LAYOUTS, grid_id, grid_problem

# Through the CPU interpreter, configs with more work than this take seconds each: they run
# on GPUs, and on the CPU with --fmha-slow.
CPU_WORK_LIMIT = 128 * 256 * 64  # hd64 T128 S512 took 11-14 s (2 cores, 2026-11-29)


def _params():
    params = []
    for config in GRID:
        for layout in LAYOUTS:
            heavy = config.q_len * config.kv_len * config.head_dim > CPU_WORK_LIMIT
            params.append(pytest.param(grid_problem(config, layout), id=grid_id(config, layout),
                                       marks=[pytest.mark.slow] if heavy else []))
    return params


@pytest.mark.parametrize("problem", _params())
def test_grid_config_matches_oracle(kernel, problem, device):
    verdict = check_kernel(kernel, problem, "normal", seed=0, device=device)
    assert verdict.passed, verdict.message(f"{kernel.name} {problem.id}")
