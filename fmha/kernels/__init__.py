"""fmha's own kernels, each a `KernelEntry` (fmha.contract.kernel) that fmha.dispatch picks
from in priority order:

- `gluon_sparse`: DeepSeek-V4's sparse decode on Hopper (index-sparse bf16 head dim 512 K = V);
- `gluon_dense`: bf16 head dim 512 on Hopper;
- `triton_paged`: contract v2 (paged caches, ragged queries, index-sparse slots, FP8/FP4 caches);
- `triton_dense`: the whole dense contract, compiled on GPUs and interpreted on the CPU;
- `triton_merge`, `torch_merge`: the D5 merge; `host`: the dense kernels' buffers and split-KV.
"""
