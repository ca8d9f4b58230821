"""Session 11's first look at fmha.gluon_sparse on an H200: the verdict against the float64
oracle on DSV4-like sparse calls (both cache layouts, -1s, topk_len, one and two scopes, a
bf16 cache, GQA), for the Gluon kernel and the Triton one, then a timing of both."""
import os
import sys
import time

import torch

from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.problem import Problem
from fmha.registry import resolve_kernel


def dsv4(batch, q_len, topk, extra, heads_q=128, layout="dsv4-fp8", extra_layout="dsv4-fp8", sink=True, bs=64,
         heads_kv=1):
    return Problem(batch=batch, q_len=q_len, kv_len=topk, heads_q=heads_q, heads_kv=heads_kv, head_dim=512,
                   shared_kv=True, sink=sink, source="sparse", block_size=bs, cache_layout=layout,
                   **(dict(extra_topk=extra, extra_block_size=bs, extra_cache_layout=extra_layout) if extra else {}))


CASES = [
    Sample(problem=dsv4(2, 1, 128, 512), seed=1),
    Sample(problem=dsv4(2, 2, 128, 512, extra_layout="dsv4-fp4"), seed=2),
    Sample(problem=dsv4(3, 1, 100, 300, heads_q=64, bs=5), seed=3, invalid=0.3, topk_lens=(100, 37, 0),
           extra_topk_lens=(300, 1, 64)),
    Sample(problem=dsv4(2, 2, 70, None, heads_q=16, sink=False), seed=4),
    Sample(problem=dsv4(2, 1, 130, 70, heads_q=96, layout=None, extra_layout=None, bs=3), seed=5, invalid=0.1),
    Sample(problem=dsv4(2, 1, 64, None, heads_q=8, heads_kv=2, layout=None, bs=7), seed=6),
    Sample(problem=dsv4(1, 1, 200, None, heads_q=64, layout=None, bs=16), distribution="large_logits", seed=7),
]

failed = 0
for name in sys.argv[1:] or ["gluon-sparse", "triton"]:
    kernel = resolve_kernel(name)
    for sample in CASES:
        t = time.time()
        try:
            verdict = check_sample(kernel, sample, os.environ.get("DEVICE", "cuda"))
            msg = verdict.message(f"{name} {sample.id}")
            failed += not verdict.passed
        except Exception as e:  # noqa: BLE001
            msg = f"{name} {sample.id}: RAISED {type(e).__name__}: {str(e)[:300]}"
            failed += 1
        print(f"{msg} [{time.time() - t:.1f} s]", flush=True)
print(f"{failed} failed")
