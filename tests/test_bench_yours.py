"""`python -m fmha.bench --fmha-kernel module:attr`: a kernel author's own kernel timed beside
fmha's and SDPA's on the same shapes, with the ratio columns about it. Without a GPU, `--quick`
is a smoke run on the CPU (wall clock, no floor): what CI can check is that the command, the
plug-in and the table work; the timings themselves are a GPU's (BENCHMARKS.md)."""

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from fmha.bench import dense as bench
from fmha.oracles import dense_reference

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run; on a GPU the bench is timed")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    shutil.copy(Path(__file__).with_name("planted_kernels.py"), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_your_kernel_is_timed_beside_fmha_and_sdpa_with_the_ratio_columns_about_it(planted, capsys):
    assert bench.main(["--quick", "--fmha-kernel", "planted_kernels:causal_only",
                       "--fmha-kernel", "planted_kernels:decode"]) == 0
    out = capsys.readouterr().out
    header, _, row = [line for line in out.splitlines() if line.startswith("|")][:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns == ["shape", "floor µs", "planted_kernels:causal_only µs", "planted_kernels:decode µs", "fmha µs",
                       "sdpa math µs", "planted_kernels:causal_only / floor", "planted_kernels:causal_only / fmha"]
    cells = dict(zip(columns, (c.strip() for c in row.strip("|").split("|"))))
    assert float(cells["planted_kernels:causal_only µs"]) > 0 and float(cells["fmha µs"]) > 0, cells
    assert re.fullmatch(r"\d+\.\d\dx", cells["planted_kernels:causal_only / fmha"]), cells
    assert "NotSupportedError: no dense keys" in cells["planted_kernels:decode µs"], cells  # a paged kernel: no shape
    assert "smoke run" in out and cells["floor µs"] == "—"


def test_a_kernel_that_does_not_import_is_a_usage_error_naming_it(planted, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--quick", "--fmha-kernel", "planted_kernels:no_such_kernel"])
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "no_such_kernel" in said and "Traceback" not in said, said


def test_without_a_gpu_only_the_quick_smoke_run_is_offered(capsys):
    with pytest.raises(SystemExit) as stopped:
        bench.main([])
    assert stopped.value.code == 2 and "--quick" in capsys.readouterr().err


FAKE_FLASH_ATTN = '''
from fmha.oracles import dense_reference

def flash_attn_func(q, k, v, causal=False):
    return dense_reference.attention(q, k, v, causal=causal)[0].to(q.dtype)
'''
FAKE_FLASH_MLA = '''
import torch
from fmha.oracles import dense_reference

def get_mla_metadata(*args, **kwargs):
    return object(), None

def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, causal=False):
    assert k_cache.shape[1] == 64 and block_table.dtype == cache_seqlens.dtype == torch.int32
    outputs = []
    for b in range(q.shape[0]):
        k = k_cache[block_table[b].long()].flatten(0, 1)[:int(cache_seqlens[b])][None]
        outputs.append(dense_reference.attention(q[b:b + 1], k, k[..., :head_dim_v], causal=causal)[0])
    return torch.cat(outputs).to(q.dtype), None
'''


def test_the_installed_peers_are_timed_on_the_contracts_inputs_in_their_own_layout(tmp_path, monkeypatch):
    """FlashAttention and FlashMLA's dense decode get columns where they import, each handed the
    bench's inputs in its own layout (FlashMLA's: a cache of 64-token pages), checked here
    against stand-ins that answer as the contract does; FlashMLA leads the ratio column."""
    assert bench.installed_peers() == {}  # none is installed on the CPU runner
    for name, text in (("flash_attn", FAKE_FLASH_ATTN), ("flash_mla", FAKE_FLASH_MLA)):
        (tmp_path / f"{name}.py").write_text(text)
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, name, module)  # gone again after the test: no other test sees it
    peers = bench.installed_peers()
    assert list(peers) == ["FlashAttention 2", "FlashMLA dense"]
    assert bench.peer({**bench.CONTENDERS, **peers}) == "FlashMLA dense"
    problem = bench.Problem(batch=2, q_len=2, kv_len=130, heads_q=8, heads_kv=1, head_dim=64, causal=True,
                            shared_kv=True)
    q, k, v = bench.inputs(problem, "cpu")
    want = dense_reference.attention(q, k, v, causal=True)[0]
    for name, make in peers.items():
        out = make(problem, q, k, v)()
        out = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=0, msg=name)
