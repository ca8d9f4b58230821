"""fmha.kernels.interpreter: Triton's interpreter without the work that changes nothing, held to
that: the same bits from fmha's kernels with and without it, and the skipped overflow check
shown to check nothing."""

import pytest
import torch
import triton
import triton.language as tl

from fmha.kernels import interpreter
from fmha.kernels.triton_utils import interpreting
from fmha.oracles.kernel_call import run_kernel
from fmha.oracles.sample import Sample
from fmha.contract import Problem
from fmha.properties.pinned import TIED_KEYS
from fmha.registry import KERNELS

pytestmark = pytest.mark.skipif(not interpreting(), reason="Triton's interpreter runs only where kernels are not compiled")


@pytest.fixture
def as_triton_has_it():
    interpreter.uninstall()
    yield
    assert interpreter.install()


@triton.jit
def _add(X, n, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, tl.load(X + offs) + n)


def test_the_interpreters_own_overflow_check_lets_an_int32_sum_wrap(as_triton_has_it):
    """Why skipping it loses nothing: with Triton's options as they come, the overflow check's
    work is done and its assertion dropped. If a Triton version starts asserting, this fails,
    and fmha.kernels.interpreter must keep the check for it."""
    x = torch.tensor([2**31 - 1, 5], dtype=torch.int32)
    _add[(1,)](x, 1, 2)
    assert x.tolist() == [-2**31, 6]


def test_it_is_installed_on_the_tiers_triton():
    """The CPU tier pins the version it was checked against (.ci/cpu-pins.txt): a new pin that
    falls back to the slow interpreter says so here rather than as a slower CI."""
    assert interpreter.install(), f"Triton {triton.__version__} is not among {interpreter.CHECKED_VERSIONS}"


CALLS = {
    # GQA, an uneven head dim, causal with a window and a sink, keys split in two and merged
    "dense": Sample(problem=Problem(batch=2, q_len=5, kv_len=300, heads_q=4, heads_kv=2, head_dim=80, causal=True,
                                    window=200, sink=True), seed=3),
    "paged": Sample(problem=Problem(batch=2, q_len=3, kv_len=70, heads_q=4, heads_kv=1, head_dim=64, source="paged",
                                    block_size=16, causal=True), seed=4),
    # two scopes, FP8 and FP4 caches, a sink
    "sparse": Sample(problem=Problem(batch=2, q_len=2, kv_len=90, heads_q=8, heads_kv=1, head_dim=512, shared_kv=True,
                                     source="sparse", block_size=16, cache_layout="dsv4-fp8", extra_topk=40,
                                     extra_block_size=8, extra_cache_layout="dsv4-fp4", sink=True), seed=5),
    # an FP8 cache at scale 2^96 whose tied keys move the exponent the running sum is held at
    "tied-keys": TIED_KEYS,
}


@pytest.mark.parametrize("name", CALLS)
def test_fmha_gives_the_same_bits_with_and_without_it(name, as_triton_has_it):
    inputs = CALLS[name].inputs()
    slow = run_kernel(KERNELS["fmha"], inputs, use_out=False)
    assert interpreter.install()
    fast = run_kernel(KERNELS["fmha"], inputs, use_out=False)
    for what, a, b in (("o", slow.o, fast.o), ("lse", slow.lse, fast.lse)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{name}: {what} differs"
