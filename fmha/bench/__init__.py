"""Speed on a GPU, side by side with the best peers in the same run, and the roofline floor:

    python -m fmha.bench [--quick] [--sparse] [--only CONTENDER ...]   # fmha.bench.dense, .sparse
    python -m fmha.bench.tune                                          # the Triton tile sweep
"""
