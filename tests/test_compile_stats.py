"""The compile count in a CUDA session's terminal summary comes from Triton's listener: each
call is a compile (with its stage times) or a load from Triton's cache; xdist workers' counts
add up on the controller."""

from types import SimpleNamespace

import triton

from fmha.ci.compile_stats import CompileStats


def _src(module, name):
    return SimpleNamespace(name=name, fn=SimpleNamespace(module=module))


def _times(*stage_us):
    return SimpleNamespace(ir_initialization=1_000_000, lowering_stages=[(f"s{i}", us) for i, us in enumerate(stage_us)],
                           store_results=500_000)


def test_compiles_loads_and_seconds_are_counted_per_kernel_and_mutants_as_one():
    stats = CompileStats()
    seen = []
    triton.knobs.compilation.listener, previous = (lambda **kw: seen.append(kw["cache_hit"])), triton.knobs.compilation.listener
    try:
        stats.install()
        listen = triton.knobs.compilation.listener
        listen(src=_src("fmha.kernels.triton_dense", "_attention_fwd"), metadata={}, metadata_group={},
               times=_times(2_000_000, 1_500_000), cache_hit=False)
        listen(src=_src("fmha.kernels.triton_dense", "_attention_fwd"), metadata={}, metadata_group={},
               times=_times(), cache_hit=True)
        listen(src=_src("fmha._mutant_normalize_twice_0123", "_attention_fwd"), metadata={}, metadata_group={},
               times=_times(), cache_hit=False)
    finally:
        triton.knobs.compilation.listener = previous
    assert seen == [False, True, False]  # a listener installed before ours still hears every call
    assert dict(stats.by_kernel) == {"triton_dense._attention_fwd": [1, 5.0, 1],
                                     "regressions mutants._attention_fwd": [1, 1.5, 0]}
    worker = {"triton_merge._merge_kernel": [2, 3.0, 0]}
    stats.add(worker)
    summary = stats.summary()
    assert summary.startswith("fmha: Triton compiled 4 kernels in 9.5 s of compile time (1 more loaded from its cache)")
    assert "triton_dense._attention_fwd 1 (5.0 s)" in summary and "triton_merge._merge_kernel 2 (3.0 s)" in summary
