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


def test_every_library_adapter_is_listed_with_how_to_get_it_and_in_the_readme(capsys):
    """Each adapter of another library: listed (here without the library, with the install
    line), and the README's one-command section runs it."""
    import pathlib

    from fmha import registry

    assert main(["--fmha-device", "cpu"]) == 0
    out = capsys.readouterr().out
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    for entry in registry.LIBRARIES:
        (row,) = [line for line in out.splitlines() if line.startswith(f"| {entry.name} |")]
        assert "| no | - |" in row and ("pip install" in row or "build" in row), row
        assert f"--fmha-kernel {entry.name}" in readme, entry.name
    # where FlashMLA is installed, its row says the limits the strategies draw within
    from fmha.adapters import flashmla
    from fmha.ci.kernels import declared

    assert "Hq (64, 128); top-k a multiple of 64; cache layouts dsv4-fp8 only" in declared(flashmla.CAPABILITIES)


def _readme_built_ins(text: str) -> set[str]:
    """The kernel names in backticks in the README's paragraph of built-in kernels."""
    import re

    paragraph = text.split("Built-in kernels (`fmha/registry.py`):", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z][a-z0-9-]*)`", paragraph))


def test_every_built_in_kernel_is_named_in_the_readme():
    """The README's paragraph of built-in kernels names every kernel the registry holds that is
    not another library's (those have their own table, checked above)."""
    import pathlib

    from fmha import registry

    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    built_in = set(registry.KERNELS) - {entry.name for entry in registry.LIBRARIES}
    missing = built_in - _readme_built_ins(readme)
    assert not missing, f"README.md's built-in kernels do not name {sorted(missing)} (fmha/registry.py registers them)"
    assert _readme_built_ins("Built-in kernels (`fmha/registry.py`): `fmha` and `triton`.\n\nNext") == {"fmha", "triton"}
