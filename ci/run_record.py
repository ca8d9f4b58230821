"""One record per run of a kernel on one case, for every command that runs kernels: verify's
agreement cases, named cases and laws, and the nightly gate's grid runs. What the run was
(`kernel`, `part`, `what`, `where`), how it went (`outcome`, `message`), what it measured
(`metrics`), and what identical findings share (`signature`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from fmha.regressions import ledger

OUTCOMES = ("passed", "failed", "raised", "skipped", "known", "fixed", "not_run")


@dataclass
class RunRecord:
    kernel: str
    part: str  # "agreement", "named cases", "laws" (verify) or "gate" (the nightly)
    what: str  # the case: a sample's id, trap/case, a law's name, a grid case's id
    dtype: str = ""  # "" for laws
    # passed, failed, raised, skipped, known (a known failure), fixed (a known failure passed),
    # not_run (planned, and no process finished it: a nightly shard killed or missing)
    outcome: str = "passed"
    message: str = ""  # the failure, the error, or the skip reason
    signature: str = ""  # what identical findings share
    where: dict = field(default_factory=dict)  # the gate's: config, layout, head dim, lengths, distribution, seed
    metrics: dict = field(default_factory=dict)  # the gate's: cos, worst_row_cos, error_ratio, lse_err, ...
    gated: bool = True  # its outcome decides the exit status (a nightly --compare kernel's does not)
    test: str = ""  # the pytest test function that makes the same check (verify's), as ledger records name it

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {', '.join(OUTCOMES)}, got {self.outcome!r}")

    @property
    def bad(self) -> bool:
        return self.outcome in ("failed", "raised", "fixed", "not_run")

    @property
    def returned(self) -> bool:
        """The kernel returned an answer that was measured."""
        return self.outcome in ("passed", "failed", "known", "fixed") and bool(self.metrics)

    @property
    def run_id(self) -> str:
        """The run as a report names it: the case, and the distribution and seed it was drawn with."""
        drawn = [f"{self.where['distribution']}"] if "distribution" in self.where else []
        drawn += [f"seed {self.where['seed']}"] if "seed" in self.where else []
        return " ".join([self.what, *drawn])

    def replace(self, **changes) -> RunRecord:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunRecord:
        return cls(**data)


def error_line(e: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def signature(text: str) -> str:
    """A finding without its numbers and locations: identical bugs give identical signatures."""
    return re.sub(r"\(b,t,h(,d)?\)=\([^)]*\)|-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)


def raised(kernel: str, part: str, what: str, e: BaseException, **fields) -> RunRecord:
    """The record of a kernel that raised instead of answering: its error's first line."""
    error = error_line(e)
    return RunRecord(kernel, part, what, outcome="raised", message=error, signature=f"raised {signature(error)}",
                     **fields)


def against_ledger(result: RunRecord, known, device: str, test: str) -> RunRecord:
    """A failure the ledger records (fmha.regressions.ledger: `test`, and the run's case) is
    `known`; a pass it records as failing at every seed is `fixed`: the record must go, or be
    narrowed, as pytest's strict xfail says."""
    record = ledger.known_failure(known, result.kernel, test, device, result.what)
    if record is None or result.outcome == "skipped":
        return result
    if result.outcome == "passed":
        if record.seeds == "some":  # a failure only some values show: this run's did not
            return result.replace(message=f"passes at this seed; recorded as failing at some ({record.issue})")
        return result.replace(outcome="fixed", message=f"passes, but is recorded as a known failure ({record.issue}): "
                                                       f"remove or narrow the record ({record.identity})",
                              signature="passes though recorded as a known failure")
    return result.replace(outcome="known", message=f"known failure ({record.issue}): {record.reason}", signature="")
