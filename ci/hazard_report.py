"""How many draws of the session carried each hazard of the table (fmha.oracles.hazards), and how
many calls showed each storage freedom of the argument records (fmha.oracles.storage), at the end
of a pytest session: counted from the bytes and strides handed to kernels, on every xdist worker,
added up on the controller. Where the session ran an agreement law (whose covering set draws every
hazard and every storage form a kernel allows), one no draw carried is named: the run did not
test it (`python -m fmha.ci.coverage` says which declaration excludes it)."""

from __future__ import annotations

from collections import Counter

import pytest

from fmha.oracles.hazards import DRAWN, HAZARDS
from fmha.oracles.storage import REACHED

SESSION = pytest.StashKey[Counter]()
BEFORE = pytest.StashKey[Counter]()
STORAGE_SESSION = pytest.StashKey[Counter]()
STORAGE_BEFORE = pytest.StashKey[Counter]()


def pytest_configure(config):
    config.stash[SESSION] = Counter()
    config.stash[STORAGE_SESSION] = Counter()
    # A session run in-process inside another (pytester) counts only its own draws.
    config.stash[BEFORE] = Counter(DRAWN)
    config.stash[STORAGE_BEFORE] = Counter(REACHED)


def _drawn_here(config) -> Counter:
    return Counter(DRAWN) - config.stash[BEFORE]


def _reached_here(config) -> Counter:
    return Counter(REACHED) - config.stash[STORAGE_BEFORE]


def _covering_tests() -> set[str]:
    from fmha.properties.catalog import LAWS

    return {law.test for law in LAWS.values() if law.covering == "family"}


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its counts go to the controller
        workeroutput["fmha_hazards"] = dict(_drawn_here(session.config))
        workeroutput["fmha_storage"] = [[a, f, n] for (a, f), n in _reached_here(session.config).items()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    node.config.stash[SESSION].update(output.get("fmha_hazards", {}))
    node.config.stash[STORAGE_SESSION].update({(a, f): n for a, f, n in output.get("fmha_storage", [])})


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workeroutput"):
        return
    counts = config.stash[SESSION] + _drawn_here(config)
    if not counts:  # no draw of the contract in this session
        return
    drawn = ", ".join(f"{name} {counts[name]}" for name in HAZARDS if counts[name])
    terminalreporter.write_line(f"fmha: hazards the draws carried: {drawn}")
    covering = _covering_tests()
    ran = any(report.nodeid.split("::")[-1].split("[")[0] in covering
              for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []))
    missing = [name for name, h in HAZARDS.items() if h.kind != "sequence" and not counts[name]]
    if ran and missing:
        terminalreporter.write_line(f"fmha: no draw carried {', '.join(missing)} (the kernels under test may opt out)")
    reached = config.stash[STORAGE_SESSION] + _reached_here(config)
    if reached:
        from fmha.contract.arguments import ARGUMENTS, storage_freedoms

        every = [(a.name, f) for a in ARGUMENTS.values() for f in storage_freedoms(a)]
        terminalreporter.write_line(f"fmha: storage freedoms the calls showed: {sum(1 for k in every if reached[k])} "
                                    f"of {len(every)} (python -m fmha.ci.coverage: per kernel, and what excludes the rest)")
