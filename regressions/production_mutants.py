"""Kernels right under the suite and wrong where production calls them: each tells a test from
production one way (or goes wrong only as production runs it), and is caught by the context or
the check made for that way (fmha.oracles.production, fmha.oracles.guard); tests/
test_production_context.py shows each caught, and the honest controls beside them passing.

Each is the float64 reference (fmha.oracles.reference_kernel) with one way of telling; where it
believes it is in production it doubles its output, a wrong answer any verdict sees. They are functions of this module, so a clean child process imports them by name.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from fmha.contract import KernelEntry
from fmha.oracles.reference_kernel import CAPABILITIES, reference
from fmha.regressions.mutation import Mutant


def _production_answer(q, k, v, **kwargs):
    """The wrong answer a kernel gives where it believes nobody checks: its output doubled."""
    o, lse = reference(q, k, v, **{**kwargs, "out": None})
    o = (o.float() * 2).to(o.dtype)
    if kwargs.get("out") is not None:
        o = kwargs["out"].copy_(o)
    return o, lse


def _answer(tested: bool, q, k, v, **kwargs):
    return reference(q, k, v, **kwargs) if tested else _production_answer(q, k, v, **kwargs)


def judge_on_the_stack(q, k, v, **kwargs):
    """Tested when a frame of the judge or of pytest is on its call stack."""
    frame, tested = sys._getframe(1), False
    while frame is not None and not tested:
        tested = frame.f_globals.get("__name__", "").startswith(("fmha.oracles", "fmha.properties", "_pytest"))
        frame = frame.f_back
    return _answer(tested, q, k, v, **kwargs)


def test_environment(q, k, v, **kwargs):
    """Tested when the environment or the process names a test: CI, PYTEST_CURRENT_TEST,
    FMHA_SEED, pytest imported."""
    tested = any(name in os.environ for name in ("CI", "PYTEST_CURRENT_TEST", "FMHA_SEED")) or "pytest" in sys.modules
    return _answer(tested, q, k, v, **kwargs)


def nan_is_a_test(q, k, v, **kwargs):
    """Tested when NaN is anywhere in its key storage or its out= buffer (the suite's poison)."""
    def holds_nan(t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return False
        whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
        return bool(torch.isnan(whole).any())

    tested = any(holds_nan(kwargs.get(name)) for name in ("out",)) or holds_nan(k)
    return _answer(tested, q, k, v, **kwargs)


_LAST_OUT: list = []


def keeps_the_callers_out(q, k, v, *, out=None, **kwargs):
    """Keeps the last out= it was handed as its workspace: a later call without out= computes
    in it and returns a copy (the caller's buffer, which it returned before, changes)."""
    if out is not None:
        _LAST_OUT[:] = [out]
        return reference(q, k, v, out=out, **kwargs)
    o, lse = reference(q, k, v, **kwargs)
    workspace = _LAST_OUT[0] if _LAST_OUT else None
    if workspace is not None and workspace.shape == o.shape and workspace.dtype == o.dtype:
        workspace.copy_(o)
        return workspace.clone(), lse
    return o, lse


def negative_bit(q, k, v, **kwargs):
    """Returns -o in memory with the negative bit set: torch shows o."""
    o, lse = reference(q, k, v, **{**kwargs, "out": None})
    return (-o)._neg_view(), lse


class _AnswersFor(TorchFunctionMode):
    """Answers for the tensors it handed out: any torch call on one sees the true answer."""

    def __init__(self):
        super().__init__()
        self.truth: dict[int, tuple] = {}  # id -> (the tensor handed out, kept: no other takes its id; its answer)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args = tuple(self.truth.get(id(a), (None, a))[1] if isinstance(a, torch.Tensor) else a for a in args)
        return func(*args, **(kwargs or {}))


_MODE: list = []


def mode_answers(q, k, v, **kwargs):
    """Writes nothing: returns an empty buffer and leaves a torch function mode active that
    answers for it with the true output (memory never written)."""
    o, lse = reference(q, k, v, **{**kwargs, "out": None})
    unwritten = torch.empty_like(o)
    if not _MODE:
        _MODE.append(_AnswersFor())
        _MODE[0].__enter__()
    _MODE[0].truth[id(unwritten)] = (unwritten, o)
    return unwritten, lse


WRONG_AFTER = 3000  # calls: a plan cache that hands back a wrong plan once it is full


def breaks_after_many_calls():
    """A plan cache of WRONG_AFTER entries whose eviction hands back another shape's plan: every
    call of the kernel after its WRONG_AFTER-th is wrong. (A maker: each build counts its own calls.)"""
    calls = itertools.count(1)

    def kernel(q, k, v, **kwargs):
        return _answer(next(calls) <= WRONG_AFTER, q, k, v, **kwargs)

    return kernel


# Honest controls: each passes every context and check.
_PLANS: dict = {}


def plans_per_shape(q, k, v, **kwargs):
    """Caches a plan (its scale) per shape, as a compiled kernel's launcher does."""
    key = (tuple(q.shape), tuple(k.shape), q.dtype, kwargs.get("scale"))
    plan = _PLANS.setdefault(key, {"scale": kwargs.get("scale")})
    return reference(q, k, v, **{**kwargs, "scale": plan["scale"]})


class _Counting(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def own_mode_scoped(q, k, v, **kwargs):
    """Computes under a torch function mode of its own, popped before it returns."""
    with _Counting():
        return reference(q, k, v, **kwargs)


def _entry(name: str, fn) -> KernelEntry:
    return KernelEntry(name=name, fn=fn, capabilities=CAPABILITIES, default_devices=(), description=fn.__doc__ or "")


CONTROLS = {"plans-per-shape": plans_per_shape, "own-mode-scoped": own_mode_scoped}

PRODUCTION_MUTANTS = tuple(
    Mutant(name, "", fn.__doc__.split("\n")[0], lambda name=name, fn=fn, made=made: _entry(name, fn() if made else fn),
           twin=lambda: _entry("reference", reference))
    for name, fn, made in (("judge-on-the-stack", judge_on_the_stack, False), ("test-environment", test_environment, False),
                           ("nan-is-a-test", nan_is_a_test, False), ("keeps-the-callers-out", keeps_the_callers_out, False),
                           ("negative-bit", negative_bit, False), ("mode-answers", mode_answers, False),
                           ("breaks-after-many-calls", breaks_after_many_calls, True)))
