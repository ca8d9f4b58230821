"""`python -m fmha.ci.nightly` on the CPU slice: the dense grid and the DSV4 sparse-decode
grid; a kernel that raises on some configs gets those runs recorded with the error, the gate
goes on, writes every report and exits 1."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.cpu_tier  # the gate on --fmha-device cpu: nightly on CUDA

RAISING = textwrap.dedent('''
    from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, reference

    def fwd(q, k, v, **kwargs):  # the float64 reference: every run it returns is at the gate
        if q.shape[-1] == 256:
            raise RuntimeError("no kernel for head dim 256 yet")
        return reference(q, k, v, **kwargs)

    fwd.capabilities = REFERENCE
''')


def test_the_gate_runs_both_grids_and_survives_a_kernel_that_raises(tmp_path):
    (tmp_path / "raising_kernels.py").write_text(RAISING)
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "fmha.ci.nightly", "--fmha-device", "cpu",
                          "--fmha-kernel", "raising_kernels:fwd", "--head-dims", "256", "512", "--out", str(out)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "CI": "true"})
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    records = json.loads((out / "results.json").read_text())["records"]
    sparse = [r for r in records if r["layout"] == "dsv4-sparse"]
    assert len(sparse) == 2 * 3 and all(r["passed"] and r["cos"] >= 0.999998 for r in sparse), sparse
    raised = [r for r in records if "error" in r]
    assert raised and all(r["head_dim"] == 256 for r in raised) and len(raised) == 4 * 2 * 3  # 4 configs x 2 layouts
    assert all("RuntimeError: no kernel for head dim 256 yet" in r["error"] for r in raised)
    assert all(r["passed"] for r in records if r["head_dim"] != 256)
    assert {r["head_dim"] for r in records} == {256, 512}
    summary = (out / "summary.md").read_text()
    assert "raised RuntimeError: no kernel for head dim 256 yet" in summary and "2 DSV4 sparse-decode configs" in summary
    assert (out / "index.html").exists()
    for name in ("results.json", "summary.md", "index.html"):  # served to whoever reads the CI's artefacts
        assert (out / name).stat().st_mode & 0o044 == 0o044, f"{name} is not readable by group and others"
