"""What a law is: one record per metamorphic law of the contract, dense and paged alike, and how
one is driven with hypothesis.

A law is a function `check(*operands, sample, device)` that runs a kernel (or a merge) on
related inputs and raises AssertionError saying what differed, where and by how much. The
`@law(...)` decorator turns it into a `Law`: the function plus what it draws, what it needs
from a kernel, the promise under which it holds bitwise, its pytest test and the mutant it is
proven on. `fmha.properties.catalog.LAWS` lists them all; the tests (properties/test_laws.py),
the kill matrix, `fmha.ci.verify` and docs/laws.md are made from that list.

Laws that hold exactly are checked bitwise for a kernel that promises it
(fmha.contract.PROMISES: `bitwise_deterministic`, `batch_invariant`) and within the verdict
for one that does not (`assert_same`).
"""

from __future__ import annotations

import inspect
import sys
import traceback
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import hypothesis
from hypothesis import Phase, assume, example, given, note, reject, strategies as st
from hypothesis.errors import FailedHealthCheck, Flaky, Unsatisfiable, UnsatisfiedAssumption

from fmha.contract import FULL_CONTRACT, KernelEntry, NotSupportedError
from fmha.oracles.check import oracle_of
from fmha.oracles.hazards import HAZARDS
from fmha.oracles.kernel_call import bitwise_difference, first_difference
from fmha.oracles.oracle import Oracle
from fmha.oracles.metrics import measure
from fmha.oracles.inputs import Inputs
from fmha.oracles.sample import Sample
from fmha.oracles.verdict import TOLERANCES, judge, two_sided
from fmha.properties.covering import for_law
from fmha.properties.paged_strategies import paged_samples
from fmha.properties.pinned import PINNED
from fmha.properties.strategies import samples

if sys.version_info < (3, 11):  # hypothesis brings the backport there
    from exceptiongroup import BaseExceptionGroup

# What a law draws: dense samples (properties/strategies.py), paged or sparse ones
# (properties/paged_strategies.py), or samples for a merge alone.
DRAWS = ("dense", "paged", "merge")
OPERANDS = {"kernel": ("kernel",), "kernel+merge": ("kernel", "merge"), "merge": ("merge",)}


@dataclass(frozen=True)
class Law:
    check: Callable  # check(*operands, sample, device)
    test: str  # its test in properties/test_laws.py; known-failure records name it
    mutant: str  # the mutant with the bug it is made for (fmha.regressions.mutants.MUTANTS), proven by tests/test_law_mutants.py
    draws: str = "dense"
    sources: tuple[str, ...] = ("dense",)  # paged draws: the key sources drawn (a kernel needs one of them)
    needs: tuple[str, ...] = ()  # features or sources every draw uses: the kernel must declare them all
    operands: str = "kernel"  # among OPERANDS
    exact_under: str | None = None  # the promise under which it holds bitwise
    label: str | None = None  # its name where several laws share one check (else the check's)
    doc: str | None = None  # what it says, where the check's docstring is another law's
    # What it runs before its draws (properties/covering.py): "family" (an agreement law: the covering
    # samples of its family of calls), "sequence" (calls in sequence: the sequence samples), or nothing.
    covering: str = ""
    # Why the law cannot be stated within a kernel's capabilities (caps -> reason or None): the
    # kernel is honest, the law is skipped with the reason.
    unstatable: Callable | None = None

    def __post_init__(self):
        if self.draws not in DRAWS or self.operands not in OPERANDS:
            raise ValueError(f"law {self.name}: draws among {DRAWS}, operands among {tuple(OPERANDS)}")
        if self.covering not in ("", "family", "sequence"):
            raise ValueError(f"law {self.name}: covering is '', 'family' or 'sequence', got {self.covering!r}")
        if (self.draws == "paged") != bool(set(self.sources) & {"paged", "sparse"}):
            raise ValueError(f"law {self.name}: paged draws come with a paged or sparse source, got {self.sources}")
        if not self.test.startswith("test_"):
            raise ValueError(f"law {self.name}: its test is named test_..., got {self.test!r}")

    @property
    def name(self) -> str:
        return self.label or self.check.__name__

    @property
    def summary(self) -> str:
        """The first sentence of its docstring."""
        doc = " ".join((self.doc or self.check.__doc__ or self.name).split())
        return doc.split(". ")[0].rstrip(".") + "."

    def __call__(self, *args):
        return self.check(*args)

    def require(self, kernel: KernelEntry, device: str) -> None:
        """Skip, with the kernel's reasons, when its declaration excludes the law on `device`."""
        reasons = kernel.not_supported_reasons(None, device, self.needs, any_source=self.sources)
        if not reasons and self.unstatable is not None:
            reasons = [why] if (why := self.unstatable(kernel.capabilities_on(device))) else []
        if reasons:
            pytest.skip(f"{kernel.name}: {'; '.join(reasons)}")

    def strategy(self, kernel: KernelEntry | None, device: str):
        """Samples inside the kernel's capabilities (the merge's own for a merge law)."""
        if self.draws == "merge":
            # The merge's work is B x T x H x Dv; S only sizes the float64 oracle that makes the
            # parts. Smaller T and S keep the CPU tier quick without changing what the merge sees.
            return samples(FULL_CONTRACT, device, **(dict(max_q_len=64, max_kv_len=256) if device == "cpu" else {}))
        caps = kernel.capabilities_on(device)
        if self.draws == "paged":
            return paged_samples(caps, device, kinds=self.sources, needs=self.needs)
        return samples(caps, device)

    def setup(self, device: str, kernel: KernelEntry | None = None, merge=None, pairs: bool = True):
        """(strategy, operands, pinned samples) of this law for `kernel` and `merge` (with `pairs`,
        the covering array's calls among them); pytest.skip, with the reason, when the kernel lacks
        what the law needs."""
        if kernel is not None and "kernel" in OPERANDS[self.operands]:
            self.require(kernel, device)
        operands = tuple(kernel if o == "kernel" else merge for o in OPERANDS[self.operands])
        pinned = [s for s in PINNED.get(self.name, [])
                  if kernel is None or not kernel.not_supported_reasons(s.problem, device)]
        if self.covering and kernel is not None:
            pinned += for_law(self, kernel, device, pairs=pairs)
        return self.strategy(kernel, device), operands, pinned

    def run(self, device: str, kernel: KernelEntry | None = None, merge=None, reproduce: str = "",
            settings=None, pinned: bool = True, pairs: bool = True) -> None:
        """The law on its pinned samples (unless `pinned` is False; the covering array's calls
        among them unless `pairs` is False), then on draws (`run_law`)."""
        strategy, operands, pinned_samples = self.setup(device, kernel, merge, pairs)
        run_law(self.check, strategy, *operands, device=device, reproduce=reproduce, settings=settings,
                pinned=pinned_samples if pinned else ())


def law(*, test: str, mutant: str, draws: str = "dense", sources: tuple[str, ...] | None = None,
        needs: tuple[str, ...] = (), operands: str = "kernel", exact_under: str | None = None, covering: str = "",
        unstatable: Callable | None = None):
    """Make the decorated check a `Law` (the record sits with the function)."""
    if sources is None:
        sources = ("paged", "sparse") if draws == "paged" else ("dense",)

    def record(check: Callable) -> Law:
        return Law(check=check, test=test, mutant=mutant, draws=draws, sources=sources, needs=needs,
                   operands=operands, exact_under=exact_under, covering=covering, unstatable=unstatable)

    return record


# -- comparisons the laws share --------------------------------------------------------------

def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Same bits (NaN payloads included), else say how many and where the first one is."""
    differ = bitwise_difference(a, b)
    if differ:
        raise AssertionError(f"{what}: {differ}")


def assert_agrees(o: torch.Tensor, reference_o: torch.Tensor, what: str, lse=None, reference_lse=None,
                  scales: Oracle | None = None, oracle_abs=None, perfect_o=None, logit_rms=None) -> None:
    """Within the verdict against `reference_o`: a float64 oracle, or another kernel output,
    whose own rounding then adds to the allowance (two_sided). `scales`, the oracle of the
    inputs, sets the fp32 logit-rounding part of the floor and the scale of the terms each
    output sums, the oracle over |v| (without it |reference_o|, too strict where they cancel);
    `logit_rms` and `oracle_abs` give those two directly; with `scales` the floor also holds what
    weights rounded to the dtype cost. `perfect_o`: an error-free kernel's result through the
    law's procedure (metrics.measure)."""
    reference_lse = None if reference_lse is None else reference_lse.double()
    tolerance = TOLERANCES[o.dtype]
    if reference_o.dtype != torch.float64:
        tolerance = two_sided(tolerance)
    if scales is not None:
        logit_rms = scales.logit_rms
        oracle_abs = scales.o_abs if oracle_abs is None else oracle_abs
    metrics = measure(o, reference_o.double(), lse, reference_lse, logit_rms=logit_rms or 0.0, oracle_abs=oracle_abs,
                      perfect_o=perfect_o, logit_magnitude=None if scales is None else scales.logit_magnitude,
                      underflow=None if scales is None else scales.underflow,
                      oracle_squares=None if scales is None else scales.o_squares)
    verdict = judge(metrics, tolerance)
    assert verdict.passed, verdict.message(what)


def assert_same(kernel: KernelEntry, device: str, promise: str, a, b, what: str, x: Inputs) -> None:
    """`a` and `b` ((o, lse) of two calls that must agree): both finite, then bitwise where the
    kernel makes `promise`, else within the verdict of one kernel output against another.
    Finite first: unread storage is NaN poison, so two runs that both read it (or both divide
    0 by 0 for a row with no keys) would otherwise be "the same"."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    for o, which in ((o_a, "first"), (o_b, "second")):
        bad = ~torch.isfinite(o)
        assert not bad.any(), (f"{what}: the {which} call's output has {int(bad.sum())} non-finite element(s), the "
                               f"first at {tuple(bad.nonzero()[0].tolist())}: unread NaN reached the output, or a row "
                               f"with no keys divided 0 by 0 (the contract: o = 0)")
    if kernel.promises(device, promise):
        # A row that sees no key is 0 of either sign (0 * a negative value is -0).
        assert_bitwise(unsigned_zeros(o_a), unsigned_zeros(o_b), f"{what} (promised {promise})")
        if lse_a is not None and lse_b is not None:
            assert_bitwise(lse_a, lse_b, f"{what}, lse (promised {promise})")
    else:
        oracle = oracle_of(x)
        assert_agrees(o_a, o_b, f"{what} (no {promise} promise: within the verdict)", lse_a, lse_b, oracle)


def unsigned_zeros(t: torch.Tensor) -> torch.Tensor:
    """`t` with -0 made +0: zeros compare by value."""
    return torch.where(t == 0, torch.zeros_like(t), t)


def variant(kernel: KernelEntry, sample: Sample, device, **changes) -> Sample:
    """The sample with a changed problem; a variant the kernel does not support is rejected."""
    changed = sample.replace(**changes)
    assume(not kernel.not_supported_reasons(changed.problem, device))
    return changed


# -- driving a law with hypothesis -----------------------------------------------------------

def run_law(law, strategy, *operands, device: str, reproduce: str = "", settings=None, pinned=()) -> None:
    """Run `law(*operands, sample, device)` (a law's check) on the `pinned` samples, then on
    samples from `strategy`; a failure prints the shrunk sample, the `reproduce` command and
    the @example line that pins it. A call the kernel refuses with NotSupportedError rejects
    that sample; when every sample is refused, the test is skipped with the kernel's reasons.
    A kernel whose two identical calls differ fails with "nondeterministic output" and the
    first differing element, rather than as a flaky test.
    (hypothesis derandomizes by the source of `check`: changing it changes every CI draw.)"""
    refused, nondeterministic = [], []
    plain, law = law, _naming_nondeterminism(law, nondeterministic)

    @given(sample=strategy)
    def check(sample):
        note(f"reproduce: {reproduce}\npin it: @example(sample={sample.pinned()!r})" if reproduce
             else f"pin it: @example(sample={sample.pinned()!r})")
        try:
            law(*operands, sample, device)
        except NotSupportedError as e:
            refused.append(str(e))
            reject()
        except Exception as failure:
            # The failing call's tensors (inputs, outputs, float64 oracles) would live on in the
            # traceback while hypothesis shrinks, and after it: on an H200 worker's 6 GB share
            # they ran the next examples, and the next test, out of memory.
            traceback.clear_frames(failure.__traceback__)
            failure.fmha_sample = sample  # the sample of the failure hypothesis reports
            raise

    for sample in pinned:
        check = example(sample=sample)(check)
    # No explain phase: the lines it names are the judge's (oracles/check.py); a failure names
    # the kernel under test instead (below).
    base = settings if settings is not None else hypothesis.settings(deadline=None)
    try:  # never a deadline: a kernel's first call compiles it
        hypothesis.settings(base, phases=[p for p in base.phases if p != Phase.explain], deadline=None)(check)()
    except (Flaky, BaseExceptionGroup) as e:  # failures hypothesis could not replay, or several at once
        if nondeterministic:
            raise AssertionError(nondeterministic[0]) from e
        for failure in getattr(e, "exceptions", ()):  # each distinct failure names what it needs
            _note_hazards(failure, plain, operands, device, reproduce)
        raise
    except AssertionError as failure:  # added here: an edit inside `check` changes every CI draw
        _note_hazards(failure, plain, operands, device, reproduce)
        if operands and callable(getattr(operands[0], "fn", None)):  # a KernelEntry or a MergeEntry
            failure.add_note(f"kernel under test: {kernel_location(operands[0])}")
        raise
    except (Unsatisfiable, FailedHealthCheck):
        if not refused:
            raise
        pytest.skip(f"the kernel refused the samples it was given (NotSupportedError): {refused[0]}")


def _note_hazards(failure: BaseException, law, operands, device: str, reproduce: str) -> None:
    """A failing hostile draw's hazards (`hazards_note`) added to its assertion's message."""
    failing = getattr(failure, "fmha_sample", None)
    if isinstance(failure, AssertionError) and failing is not None and failing.hazards_carried(device):
        failure.add_note(hazards_note(law, operands, failing, device, reproduce))


# A failing hostile draw is rerun without one hazard at a time, at most this many times per
# failing test: a kernel that fails everything costs seconds more, not minutes.
HAZARD_RERUNS = 8


def hazards_needed(law, operands, sample: Sample, device: str, reruns: int = HAZARD_RERUNS):
    """Delta debugging over a failing sample's hazards: each hazard its inputs carry is removed
    in turn, and stays removed while the law still fails. Returns (the hazards the failure
    needs, the smallest sample that still fails, the hazards not tried for want of reruns)."""
    carried = [name for name in sample.hazards_carried(device) if HAZARDS[name].remove is not None]
    needed = []
    for at, name in enumerate(carried):
        if at == reruns:
            return needed, sample, carried[at:]
        try:
            candidate = HAZARDS[name].remove(sample)
        except ValueError:  # a sample the hazard cannot leave
            needed.append(name)
            continue
        if _still_fails(law, operands, candidate, device):
            sample = candidate
        else:
            needed.append(name)
    return needed, sample, []


def _still_fails(law, operands, sample: Sample, device: str) -> bool:
    """Whether the law fails on `sample`; a sample it rejects (assume) or the kernel refuses
    does not. Run as hypothesis's one explicit example, where the law's assume() belongs."""
    failed = []

    @hypothesis.settings(phases=[Phase.explicit], database=None, deadline=None)
    @example(sample=sample)
    @given(sample=st.just(sample))
    def rerun(sample):
        try:
            law(*operands, sample, device)
        except (UnsatisfiedAssumption, NotSupportedError):
            return
        except Exception as failure:  # noqa: BLE001 -- any failure counts
            traceback.clear_frames(failure.__traceback__)
            failed.append(True)

    rerun()
    return bool(failed)


def hazards_note(law, operands, sample: Sample, device: str, reproduce: str = "") -> str:
    """What a failing hostile draw needs, for the failure's message."""
    needed, smallest, untried = hazards_needed(law, operands, sample, device)
    pin = f"pin it without the others: @example(sample={smallest.pinned()!r})"
    rerun = f"\nreproduce: {reproduce}" if reproduce else ""
    left = f" (not tried, out of reruns: {', '.join(untried)})" if untried else ""
    if not needed:
        always = [name for name in smallest.hazards_carried(device) if HAZARDS[name].remove is None]
        kept = f" but the poison every such draw holds ({', '.join(always)})" if always else ""
        return f"hazard: none needed: it fails without every hazard the draw carried{kept}{left}; {pin}{rerun}"
    named = "; ".join(f"{name}: {HAZARDS[name].hostile}" for name in needed)
    return (f"hazard: the failure needs {', '.join(needed)} (without it the law passes: {named}){left}\n"
            f"{pin}{rerun}")


def kernel_location(kernel) -> str:
    """Where the kernel (or merge) under test is defined: its host function for fmha's own
    kernels, the callable given with --fmha-kernel otherwise."""
    fn = inspect.unwrap(getattr(kernel, "apply", None) or kernel.fn)
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]} ({fn.__module__}.{fn.__qualname__})"
    except (TypeError, OSError):
        return repr(fn)


def _naming_nondeterminism(law, found: list):
    """`law`, whose failures on a kernel that gives two identical calls different answers say
    so (and are kept in `found`): a law can only be judged on a kernel that answers one call
    one way."""

    def judged(*args):
        try:
            return law(*args)
        except AssertionError as failure:
            kernel, sample, device = args[0], args[-2], args[-1]
            if not isinstance(kernel, KernelEntry):
                raise
            differ = first_difference(kernel, sample.inputs(device))
            if differ is None:
                raise
            promise = " (it promises bitwise_deterministic)" if kernel.promises(device, "bitwise_deterministic") else ""
            found.append(f"{kernel.name} {sample.id}: nondeterministic output: two identical calls differ{promise}: "
                         f"{differ}")
            raise AssertionError(found[-1]) from failure

    return judged
