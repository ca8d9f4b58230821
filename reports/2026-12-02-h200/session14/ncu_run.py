"""Session 14: one variant of variants.py (its index: argv[1]) on the DSV4 B64 T1 top-k 128+512
FP8 bench shape, three calls, for `ncu -k regex:_sparse_fwd` (call2.sh; named profile.py then)."""
import importlib.util
import os
import sys

import torch

from fmha import bench_sparse
from fmha.contract import check_attention_args
from fmha.regressions.mutation import _import_patched

spec = importlib.util.spec_from_file_location("variants", os.path.join(os.path.dirname(__file__), "variants.py"))
variants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants)
module = _import_patched("_variant", "profiled", list(variants.SOURCES.values())[int(sys.argv[1])])
x = bench_sparse.inputs(bench_sparse.SHAPES["DSV4 sparse decode B64 Hq128 T1 top-k 128+512 FP8"])
args = dict(sink=x["sink"], indices=x["indices"], extra_k_cache=x["extra_k_cache"], extra_indices=x["extra_indices"])
problem = check_attention_args(x["q"], x["k_cache"], x["k_cache"], cache_layout="dsv4-fp8",
                               extra_cache_layout="dsv4-fp8", **args)
for _ in range(3):
    module.attention(problem, x["q"], x["k_cache"], x["k_cache"], **args)
torch.cuda.synchronize()
