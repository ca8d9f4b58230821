"""Session 13: fmha.gluon_sparse on the DSV4 B64 T1 top-k 128+512 FP8 bench shape, three calls,
for `ncu -k regex:_sparse_fwd` (call1.sh)."""
import torch

from fmha import bench_sparse

p = bench_sparse.SHAPES["DSV4 sparse decode B64 Hq128 T1 top-k 128+512 FP8"]
run = bench_sparse.CONTENDERS["fmha"](p, bench_sparse.inputs(p))
for _ in range(3):
    run()
torch.cuda.synchronize()
