"""pytest plumbing for fmha: kernel selection, device, markers, skips that carry reasons.

    pytest --fmha-kernel sdpa-math --fmha-kernel my_pkg.attn:fwd   # repeatable
    pytest --fmha-merge torch-merge --fmha-merge my_pkg.merge:merge
    pytest --fmha-device cpu                                       # default: cuda if present

A test takes the `kernel` (or `merge_kernel`) argument to run once per selected kernel. When
it is also parametrized with a `problem`, a combination the kernel does not support becomes a
skip whose message is the kernel's own reason; `@pytest.mark.fmha_needs("lse")` adds
per-call needs to that check.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from fmha import registry
from fmha.problem import Problem
from regressions.ledger import known_failure

MARKERS = {
    "gpu": "needs a CUDA device; skipped with a reason elsewhere",
    "slow": "takes seconds through the CPU interpreter: skipped on the CPU unless --fmha-slow",
    "nightly": "nightly tier: runs only with --fmha-nightly",
    "property": "hypothesis property test",
    "regression": "named regression case from the trap library",
    "fmha_needs(*features)": "per-call contract features the test needs from the kernel (lse, out)",
}


# Hypothesis profiles, chosen with --hypothesis-profile (default: ci under CI=true, else dev).
_SLOW_DRAWS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_SLOW_DRAWS)
settings.register_profile("ci", max_examples=8, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=_SLOW_DRAWS)
settings.register_profile("nightly", max_examples=200, deadline=None, print_blob=True,
                          database=DirectoryBasedExampleDatabase(".hypothesis/nightly"),
                          suppress_health_check=_SLOW_DRAWS)
# triage: first failure, unshrunk, fast (shrinking through the CPU interpreter takes minutes).
settings.register_profile("triage", settings.get_profile("ci"), phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser):
    group = parser.getgroup("fmha", "fmha kernel verification")
    group.addoption("--fmha-kernel", action="append", default=[], metavar="NAME|module:attr",
                    help="kernel under test: a registry name or an import path (repeatable); "
                         "default: every registered kernel that runs on the device by default")
    group.addoption("--fmha-merge", action="append", default=[], metavar="NAME|module:attr",
                    help="merge callable under test (repeatable); default: every registered merge")
    group.addoption("--fmha-device", default=None, choices=("cpu", "cuda"),
                    help="device to test on; default cuda when available, else cpu")
    group.addoption("--fmha-nightly", action="store_true", help="also run tests marked nightly")
    group.addoption("--fmha-slow", action="store_true", help="on the CPU, also run tests marked slow")


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    device = config.getoption("--fmha-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--fmha-device cuda: CUDA is not available on this machine")
    try:
        kernels = registry.selected_kernels(config.getoption("--fmha-kernel"), device)
        merges = [registry.resolve_merge(s) for s in config.getoption("--fmha-merge")]
    except ValueError as e:
        raise pytest.UsageError(str(e)) from e
    config.fmha_device = device
    config.fmha_kernels = kernels
    config.fmha_merges = merges or list(registry.MERGES.values())


def pytest_report_header(config):
    names = ", ".join(k.name for k in config.fmha_kernels)
    merges = ", ".join(m.name for m in config.fmha_merges)
    return f"fmha: device {config.fmha_device}; kernels {names}; merges {merges}"


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "kernel" in metafunc.fixturenames:
        metafunc.parametrize("kernel", config.fmha_kernels, ids=[k.name for k in config.fmha_kernels])
    if "merge_kernel" in metafunc.fixturenames:
        metafunc.parametrize("merge_kernel", config.fmha_merges, ids=[m.name for m in config.fmha_merges])


def problem_params(problems, marks=()) -> list:
    """pytest.param per Problem, with the problem's readable id."""
    return [pytest.param(p, id=p.id, marks=marks) for p in problems]


def pytest_collection_modifyitems(config, items):
    device = config.fmha_device
    for item in items:
        if item.get_closest_marker("gpu") and device != "cuda":
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (running on cpu)"))
        if item.get_closest_marker("slow") and device == "cpu" and not config.getoption("--fmha-slow"):
            item.add_marker(pytest.mark.skip(reason="slow through the CPU interpreter: runs on GPUs, or pass --fmha-slow"))
        if item.get_closest_marker("nightly") and not config.getoption("--fmha-nightly"):
            item.add_marker(pytest.mark.skip(reason="nightly tier: pass --fmha-nightly to run it"))
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params:
            continue
        if "merge_kernel" in params:
            reasons = params["merge_kernel"].not_supported_reasons(device)
            if reasons:
                item.add_marker(pytest.mark.skip(reason=f"{params['merge_kernel'].name}: {'; '.join(reasons)}"))
        kernel = params.get("kernel")
        problem = params.get("problem") or getattr(params.get("case"), "problem", None)
        if kernel is not None:
            record = known_failure(kernel.name, item.originalname, device, item.callspec.id)
            if record:
                item.add_marker(pytest.mark.xfail(strict=True, run=not record.quarantine,
                                                  reason=f"known failure ({record.issue}): {record.reason}"
                                                  + (" [quarantined: not launched]" if record.quarantine else "")))
        if kernel is None or not isinstance(problem, Problem):
            continue
        needs = [f for marker in item.iter_markers("fmha_needs") for f in marker.args]
        reasons = kernel.not_supported_reasons(problem, device, needs)
        if reasons:
            item.add_marker(pytest.mark.skip(reason=f"{kernel.name}: {'; '.join(reasons)}"))


@pytest.fixture(scope="session")
def device(request) -> str:
    return request.config.fmha_device
