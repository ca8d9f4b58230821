"""Every selected kernel agrees with the oracle on the 72-config grid, in MHA, GQA and
MQA-with-K-is-V layouts, in every dtype the kernel declares (ids such as
hd512-T4-S640-mqa-fp16)."""

import pytest
import torch

from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.contract import DTYPE_NAMES
from fmha.properties.grid import GRID, LAYOUTS, grid_id, grid_problem

# Through the CPU interpreter, configs with more work than this take seconds each: they run
# on GPUs, and on the CPU with --fmha-slow.
CPU_WORK_LIMIT = 128 * 256 * 64  # hd64 T128 S512 took 11-14 s (2 cores)


def _slow_on_cpu(config, dtype) -> bool:
    """The CPU tier runs the lighter configs in bf16 and their decode shapes (T = 1) in the
    other dtypes (fp16 and fp32 at T = 4 added 115 s on 2 cores): the whole grid
    in every dtype is the GPU tier's."""
    heavy = config.q_len * config.kv_len * config.head_dim > CPU_WORK_LIMIT
    return heavy or (dtype != torch.bfloat16 and config.q_len > 1)


def _params():
    return [pytest.param(grid_problem(config, layout, dtype), id=grid_id(config, layout, dtype),
                         marks=[pytest.mark.slow] if _slow_on_cpu(config, dtype) else [])
            for config in GRID for layout in LAYOUTS for dtype in DTYPE_NAMES]


@pytest.mark.parametrize("problem", _params())
def test_grid_config_matches_oracle(kernel, problem, device):
    sample = Sample(problem=problem)
    verdict = check_sample(kernel, sample, device)
    assert verdict.passed, f"{verdict.message(f'{kernel.name} {sample.id}')}\npin it: {sample.pinned()!r}"
