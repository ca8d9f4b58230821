"""What the suite's tests read of the pytest session they run in: its device (set by the fmha
plugin, fmha.ci.plugin), the hypothesis profiles and settings the laws run under, and the
command that reruns one test.

The profiles are registered on import, before hypothesis reads --hypothesis-profile; an
environment without hypothesis (fmha installed without [test]) gets the plugin without them.
"""

from __future__ import annotations

import os
import shlex
from typing import NamedTuple

import pytest

DEVICE = pytest.StashKey[str]()  # the session's device: --fmha-device, else cuda when present
RUN_SEED = pytest.StashKey[int]()  # the run's seed: --fmha-seed, else a fresh one (fmha.oracles.run_seed)

# A kernel's --fmha-kernel spec as this session was given it, by the kernel's name (a mutant
# or a registry entry reached by import path is named otherwise).
KERNEL_SPECS = pytest.StashKey[dict]()

# Options a rerun of one test needs, as given to this session.
_RERUN_OPTIONS = ("--fmha-device", "--fmha-known-failures", "--fmha-activations", "--hypothesis-profile")


def register_profiles() -> None:
    """Hypothesis profiles for the laws, chosen with --hypothesis-profile; without it the laws
    run under fmha-ci when CI is set, else fmha-dev (other tests in the session keep their
    own)."""
    try:
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
    except ImportError:
        return
    slow_draws = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("fmha-dev", max_examples=10, deadline=None, suppress_health_check=slow_draws)
    settings.register_profile("fmha-ci", max_examples=6, deadline=None, derandomize=True, database=None,
                              print_blob=True, suppress_health_check=slow_draws)
    settings.register_profile("fmha-nightly", max_examples=200, deadline=None, print_blob=True,
                              database=DirectoryBasedExampleDatabase(".hypothesis/nightly"),
                              suppress_health_check=slow_draws)
    # triage: first failure, unshrunk, fast (shrinking through the CPU interpreter takes minutes).
    settings.register_profile("fmha-triage", settings.get_profile("fmha-ci"),
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])


register_profiles()



class Budget(NamedTuple):
    """A profile's replays of judged calls in production's contexts (fmha.oracles.production)."""

    twins: int  # a test's first poisoned calls twinned with stale values
    share: float  # of the tests that replay their first judged call in another context too
    children: int  # child-process replays a process may make (a child starts once, about 2 s)
    soak: int  # calls before the soak law's call is made again (fmha.properties.dense_laws)


# Per profile, the judged calls replayed in production's contexts (fmha.oracles.production):
# a test's poisoned calls twinned with stale values, the share of tests that replay a call in
# another context too, the replays in a clean child process each process may make, and the calls
# the soak law makes before it calls again. The CI profile's share keeps the replays' cost within
# what BENCHMARKS.md ("Judged where production calls") shows; the nightly replays every test.
_EVERY_RUN = Budget(twins=1, share=1 / 16, children=16, soak=1 << 12)
REPLAYS = {"fmha-dev": _EVERY_RUN, "fmha-ci": _EVERY_RUN, "fmha-triage": _EVERY_RUN,
           "fmha-nightly": Budget(twins=3, share=1.0, children=1024, soak=1 << 17)}


def replay_settings(config) -> Budget:
    """The replays of the profile the laws run under; the nightly's with --fmha-nightly."""
    if config.getoption("--fmha-nightly", False):
        return REPLAYS["fmha-nightly"]
    profile = config.getoption("hypothesis_profile", None) or ("fmha-ci" if os.environ.get("CI") else "fmha-dev")
    return REPLAYS.get(profile, REPLAYS["fmha-dev"])


def law_settings(config):
    """The hypothesis settings the laws run under: those of --hypothesis-profile when given,
    else fmha-ci under CI and fmha-dev elsewhere."""
    from hypothesis import settings

    if config.getoption("hypothesis_profile", None):
        return None  # hypothesis has loaded the profile as the default
    return settings.get_profile("fmha-ci" if os.environ.get("CI") else "fmha-dev")


def reproduce_command(item) -> str:
    """A command that reruns `item` alone against the same kernel, runnable as printed from
    the directory this session ran in (the test file by its absolute path)."""
    config = item.config
    params = item.callspec.params if hasattr(item, "callspec") else {}
    args = ["pytest", f"{item.path}::{item.name}"]
    if "kernel" in params:
        name = params["kernel"].name
        args += ["--fmha-kernel", config.stash.get(KERNEL_SPECS, {}).get(name, name)]
    if "merge_kernel" in params:
        args += ["--fmha-merge", params["merge_kernel"].name]
    args += ["--fmha-seed", str(config.stash[RUN_SEED])]
    for option in _RERUN_OPTIONS:
        value = config.getoption(option, None) if option != "--fmha-device" else config.stash[DEVICE]
        if value:
            args += [option, os.path.abspath(value) if option in ("--fmha-known-failures", "--fmha-activations")
                     else value]
    for directory in config.getoption("--fmha-cases", None) or ():
        args += ["--fmha-cases", directory]
    for name in config.getoption("--fmha-replay-env", None) or ():
        args += ["--fmha-replay-env", name]
    return shlex.join(args)


def problem_params(problems, marks=()) -> list:
    """pytest.param per Problem (or Sample), with its readable id."""
    return [pytest.param(p, id=p.id, marks=marks) for p in problems]
