"""How many draws of the session carried each hazard of the table (fmha.oracles.hazards), how many
calls showed each storage freedom of the argument records (fmha.oracles.storage) and each form of
the relations (fmha.contract.relations), at the end of a pytest session: counted from the bytes,
strides and scalars handed to kernels, on every xdist worker, added up on the controller. Where the
session ran an agreement law (whose covering set draws every hazard and every storage form a kernel
allows), one no draw carried is named: the run did not test it (`python -m fmha.ci.coverage` says
which declaration excludes it)."""

from __future__ import annotations

from collections import Counter

import pytest

from fmha.oracles.hazards import DRAWN, HAZARDS
from fmha.oracles.storage import REACHED, RELATIONS_SEEN

# What each counts, by its key in a worker's output: hazards (by name), storage freedoms
# ((record, freedom), sent as a list) and relations' forms ((relation, form)).
COUNTED = {"fmha_hazards": DRAWN, "fmha_storage": REACHED, "fmha_relations": RELATIONS_SEEN}
SESSION = pytest.StashKey[dict]()
BEFORE = pytest.StashKey[dict]()


def pytest_configure(config):
    config.stash[SESSION] = {key: Counter() for key in COUNTED}
    # A session run in-process inside another (pytester) counts only its own draws.
    config.stash[BEFORE] = {key: Counter(counter) for key, counter in COUNTED.items()}


def _here(config, key: str) -> Counter:
    """This session's counts of `key`: the workers' added up, and this process's own."""
    return config.stash[SESSION][key] + (Counter(COUNTED[key]) - config.stash[BEFORE][key])


def _covering_tests() -> set[str]:
    from fmha.properties.catalog import LAWS

    return {law.test for law in LAWS.values() if law.covering == "family"}


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its counts go to the controller
        for key in COUNTED:
            workeroutput[key] = [[k, n] for k, n in _here(session.config, key).items()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    for key in COUNTED:
        node.config.stash[SESSION][key].update({tuple(k) if isinstance(k, list) else k: n for k, n in output.get(key, [])})


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workeroutput"):
        return
    counts = _here(config, "fmha_hazards")
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
    reached = _here(config, "fmha_storage")
    if reached:
        from fmha.contract.arguments import ARGUMENTS, storage_freedoms

        every = [(a.name, f) for a in ARGUMENTS.values() for f in storage_freedoms(a)]
        terminalreporter.write_line(f"fmha: storage freedoms the calls showed: {sum(1 for k in every if reached[k])} "
                                    f"of {len(every)} (python -m fmha.ci.coverage: per kernel, and what excludes the rest)")
    shown = _here(config, "fmha_relations")
    if shown:
        from fmha.contract.relations import RELATIONS

        every = [(r.name, f) for r in RELATIONS.values() for f in r.forms]
        terminalreporter.write_line(f"fmha: relations' forms the calls showed: {sum(1 for k in every if shown[k])} of "
                                    f"{len(every)}")
