"""The problems contract v2's named cases are drawn on: small enough for the CPU
interpreter, each with what its bugs need (several requests, pages that end inside a
request, GQA heads, Dv != D; DSV4's quantized K = V cache of head dim 512 with a sink)."""

from fmha.contract import Problem

PAGED = Problem(batch=3, q_len=2, kv_len=9, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=16, causal=True,
                source="paged", block_size=4)
SPARSE = Problem(batch=2, q_len=2, kv_len=6, heads_q=8, heads_kv=1, head_dim=512, shared_kv=True, sink=True,
                 source="sparse", block_size=5, cache_layout="dsv4-fp8")
TWO_SCOPES = SPARSE.replace(extra_topk=4, extra_block_size=2, extra_cache_layout="dsv4-fp4")

# Where the paged and sparse traps without a seed log come from.
SHIPPED = "named in the contract-v2 issue among the bugs production paged and sparse kernels shipped"
