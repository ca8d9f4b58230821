"""The roofline floors `python -m fmha.bench` divides by, and the columns `fmha.bench.cuda_variants`
assembles (the timings themselves need a GPU)."""

import os

import pytest

from fmha.bench import dense as bench
from fmha.bench import sparse as sparse_bench
from fmha.contract.cache_layouts import DSV4_FP8


@pytest.mark.parametrize("name", sparse_bench.SHAPES)
def test_a_sparse_decode_does_the_flops_of_the_dense_call_over_its_keys(name):
    """Each query row over its own top-k keys: the dense call with one row per request and
    S = top-k does the same multiply-adds."""
    p = sparse_bench.SHAPES[name]
    dense = p.replace(source="dense", batch=p.batch * p.q_len, q_len=1, kv_len=sparse_bench.keys_per_row(p),
                      block_size=None, cache_layout=None, extra_topk=None, extra_block_size=None,
                      extra_cache_layout=None)
    assert sparse_bench.flops(p) == bench.flops(dense)


@pytest.mark.parametrize("name", sparse_bench.SHAPES)
def test_a_sparse_decode_moves_its_fp8_keys_once_per_query_row(name):
    """The bytes are the FP8 keys each row gathers (data, rope and scales), not bf16 keys."""
    p = sparse_bench.SHAPES[name]
    rows = p.batch * p.q_len
    q_o_lse = rows * p.heads_q * (2 * (p.head_dim + p.head_dim_v) + 4)
    assert sparse_bench.bytes_moved(p) - q_o_lse == rows * sparse_bench.keys_per_row(p) * DSV4_FP8.token_bytes
    assert DSV4_FP8.token_bytes == 448 + 2 * 64 + 8


def test_cuda_variants_assembles_each_column_from_its_own_source(tmp_path):
    """`python -m fmha.bench.cuda_variants`'s columns (the timings need a GPU): the kernel as it
    is, a git revision with its own header beside it, an edited copy; each built under a name
    of its content, so that torch's cache never serves one variant for another."""
    import subprocess

    from fmha.bench import cuda_variants
    from fmha.kernels import cuda_sparse

    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=cuda_sparse.SOURCE_DIR, capture_output=True).returncode:
        pytest.skip("the package does not run from a git checkout (an installed copy): no revisions to show")
    edited = tmp_path / "edited.cu"
    edited.write_text(open(cuda_sparse.SOURCE).read().replace("constexpr int STAGES = 2;", "constexpr int STAGES = 3;"))
    columns = cuda_variants.variants(["HEAD"], [f"edited={edited}"], with_kernel=True)
    assert list(columns) == ["kernel", "HEAD", "edited"]
    assert columns["kernel"] == cuda_sparse.SOURCE
    assert open(columns["HEAD"]).read().startswith("// DeepSeek-V4's sparse decode")
    assert sorted(os.listdir(os.path.dirname(columns["HEAD"]))) == ["sparse_decode.cu", "wgmma.cuh"]
    names = {cuda_sparse.variant_name(name, path) for name, path in columns.items()}
    assert len(names) == 3 and cuda_sparse.extension_name("variant", "edited", edited.read_text()) in names
    with pytest.raises(SystemExit, match="NAME=PATH"):
        cuda_variants.variants([], ["no-path-given"], with_kernel=False)


def test_sparse_trace_names_a_missing_source_before_anything_is_built(capsys):
    """`python -m fmha.bench.sparse_trace --source PATH` traces an edited copy of the kernel; a
    path that is not a file is the caller's error, said before any build or GPU check."""
    from fmha.bench import sparse_trace

    with pytest.raises(SystemExit) as exit_:
        sparse_trace.main(["--source", "/no/such/variant.cu"])
    assert exit_.value.code == 2
    assert "--source: expected the path of a .cu file, got '/no/such/variant.cu'" in capsys.readouterr().err


def test_sparse_trace_runs_the_shape_asked_for_and_names_one_it_does_not_have(monkeypatch, capsys):
    """`--shape` picks the first bench shape whose name has the text; text no shape has is the
    caller's error, with the shapes it could have named."""
    from fmha.bench import sparse_trace

    with pytest.raises(SystemExit) as exit_:
        sparse_trace.main(["--shape", "B512"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--shape: expected part of a bench shape's name" in err and "got 'B512'" in err
    assert all(name in err for name in sparse_bench.SHAPES)

    traced = []

    def inputs(p):  # the trace's first step on the GPU: what shape did it get?
        traced.append(p)
        raise RuntimeError("stop before the GPU")

    monkeypatch.setattr(sparse_trace.cuda_sparse, "availability", lambda device: None)
    monkeypatch.setattr(sparse_trace.sparse, "inputs", inputs)
    for asked, expected in (([], next(iter(sparse_bench.SHAPES))), (["--shape", "B256 Hq128 T2 top-k 128+1024"],
                                                                   "DSV4 sparse decode B256 Hq128 T2 top-k 128+1024 FP8")):
        with pytest.raises(RuntimeError, match="stop before the GPU"):
            sparse_trace.main(asked)
        assert traced.pop() == sparse_bench.SHAPES[expected]


def test_sparse_trace_spans_are_taken_between_the_right_events_and_tiles():
    """The spans `python -m fmha.bench.sparse_trace` prints, on clocks made up so that each span has
    its own length: a tile every 5,000 cycles, QK^T 1,300, softmax 1,600, P.V 1,800 (so 300 to the
    next keys), warpgroup 1's P.V 1,100, the producer's stores 700 and its fill 3,000; the first and
    last tiles (a slow start, a slow end) are left out."""
    from fmha.bench import sparse_trace

    events = []
    for i in range(10):
        ready = 5000 * i + (4000 if i == 0 else 0) + (9000 if i == 9 else 0)
        tile = [0] * 11
        tile[0], tile[1], tile[2], tile[3] = ready, ready + 1300, ready + 2900, ready + 4700
        tile[4], tile[5] = ready + 3000, ready + 4100
        tile[6], tile[10] = ready - 3000, ready - 2300
        events.append(tile)
    got = sparse_trace.spans(events, 10)
    lengths = (5000, 1300, 1600, 1800, 300, 1100, 700, 3000)
    assert got == {what: (n, n, n) for what, n in zip(sparse_trace.SPANS, lengths)}


@pytest.mark.parametrize("only", (["fmha", "fmha, CUDA", "FlashMLA"], ["fmha, CUDA", "FlashMLA"]))
def test_the_ratio_columns_are_about_fmha_or_the_one_fmha_kernel_run(only, monkeypatch):
    """`--only "fmha, CUDA" --only FlashMLA` divides that kernel's time, not an empty fmha column."""
    times = {"fmha": 50.0, "fmha, CUDA": 40.0, "FlashMLA": 20.0}
    monkeypatch.setattr(bench, "time_us", lambda fn: fn())
    contenders = {name: (lambda p, *x, t=times[name]: lambda: t) for name in only}
    table = bench.Table(["shape", "floor", *only, "a", "b"])
    bench._rows({"s": None}, contenders, lambda p: (), lambda p: 10.0, table)
    mine = only[0]
    assert bench.ours(contenders) == mine
    assert table.rows[0][-2:] == [f"{times[mine] / 10:.2f}x", f"{times[mine] / 20:.2f}x"], table.rows
