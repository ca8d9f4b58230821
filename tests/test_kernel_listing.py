"""`python -m fmha.ci.kernels`: every registered kernel, whether it runs here and why not."""

import pytest

from fmha.ci.kernels import main

pytestmark = pytest.mark.cpu_tier  # the listing on --fmha-device cpu


def test_the_listing_says_what_runs_here_and_why_the_rest_does_not(capsys):
    assert main(["--fmha-device", "cpu"]) == 0
    kernels = capsys.readouterr().out.split("| merge |")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in kernels.splitlines() if line.startswith("| ")}
    assert "| yes | by default | sources dense, paged, ragged, sparse, two_scopes;" in rows["fmha"], rows["fmha"]
    assert "head dims 16-512 in steps of 16" in rows["fmha"]
    assert rows["gluon-sparse"].endswith("| no | - | needs a CUDA GPU |"), rows["gluon-sparse"]
    assert rows["sdpa-cudnn"].endswith("| no | - | runs on cuda, not cpu |"), rows["sdpa-cudnn"]
    assert "| yes | when selected |" in rows["reference"] and "Dv = D only" in rows["sdpa-flash"]
