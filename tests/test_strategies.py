"""The strategies' draws fit the memory of the float64 oracle on each device: on a GPU sixteen
workers share one device, so no tensor the oracle builds may pass 1 GiB (2^27 float64s)."""

import dataclasses

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from fmha.contract import FULL_CONTRACT
from fmha.properties.strategies import problems

ORACLE_ELEMENTS = {"cpu": 2**26, "cuda": 2**27}


def _largest_oracle_tensor(p) -> int:
    """Elements of the largest float64 tensor `reference.oracle` builds for `p`: the logits,
    K and V repeated for every query head, or Q and O."""
    logits = p.batch * p.heads_q * p.q_len * p.kv_len
    keys = p.batch * p.kv_len * p.heads_q * max(p.head_dim, p.head_dim_v)
    rows = p.batch * p.heads_q * p.q_len * max(p.head_dim, p.head_dim_v)
    return max(logits, keys, rows)


# A kernel that takes few keys: the queries and outputs, not the logits, are then what is large.
FEW_KEYS = dataclasses.replace(FULL_CONTRACT, max_kv_len=4)


@pytest.mark.parametrize("caps", [pytest.param(FULL_CONTRACT, id="full"), pytest.param(FEW_KEYS, id="few-keys")])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(data=st.data())
def test_a_drawn_problem_fits_the_oracle_in_memory(device, caps, data):
    p = data.draw(problems(caps, device, long_context=data.draw(st.booleans())))
    elements = _largest_oracle_tensor(p)
    target(elements)  # toward the largest draws
    assert elements <= ORACLE_ELEMENTS[device], (
        f"{p!r}: the oracle holds {elements * 8 / 2**30:.2f} GiB in one float64 tensor on {device}, "
        f"over {ORACLE_ELEMENTS[device] * 8 / 2**30:.1f} GiB")
