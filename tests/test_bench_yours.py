"""`python -m fmha.bench --fmha-kernel module:attr`: a kernel author's own kernel timed beside
fmha's and SDPA's on the same shapes, with the ratio columns about it. Without a GPU, `--quick`
is a smoke run on the CPU (wall clock, no floor): what CI can check is that the command, the
plug-in and the table work; the timings themselves are a GPU's (BENCHMARKS.md)."""

import re
import shutil
from pathlib import Path

import pytest
import torch

from fmha.bench import dense as bench

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
