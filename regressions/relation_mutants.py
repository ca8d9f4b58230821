"""Mutants on the relations between a call's arguments (fmha.contract.relations): the float64
reference with one way of passing arguments together handled wrong. Each passed every test while
the draws passed arguments only in the correlated ways the strategies were written (causal=True
beside every window, out= wherever a kernel takes it, Python scalars, a second scope quantized only
beside a quantized first); the draws from the relation records reach them (docs/kill-matrix.md has
their rows). Run one like any kernel:

    pytest --pyargs fmha.properties --fmha-kernel mutant:window-needs-the-causal-flag
"""

from __future__ import annotations

import functools

from fmha.oracles.reference_kernel import ENTRY as REFERENCE_ENTRY
from fmha.regressions.mutation import Mutant
from fmha.regressions.paged_mutants import _decoded_as
from fmha.regressions.shipped_mutants import _entry, through


def _window_needs_the_causal_flag(args):
    """The window applied inside the causal branch only: a window passed with causal=False (which
    it implies) masks nothing."""
    if not args.get("causal"):
        args["window"] = None
    return args


def _causal_by_identity(args):
    """`causal is True`: a numpy bool (what a config read through numpy gives) is not masked."""
    args["causal"] = args.get("causal") is True
    if args.get("window") is not None and not args["causal"]:
        args["window"] = None
    return args


def _scale_of_another_type_ignored(args):
    """`scale if isinstance(scale, float) else D ** -0.5`: an int or a numpy float32 scale is dropped."""
    if not isinstance(args.get("scale"), float):
        args["scale"] = None
    return args


def _window_of_another_type_ignored(args):
    """`window if isinstance(window, int) else None`: a numpy integer window masks as causal only."""
    if not isinstance(args.get("window"), int):
        args["window"] = None
    return args


def _second_scope_scales_follow_the_first(args):
    """The tile scales applied under the first scope's layout: a quantized second scope beside a
    first in q's dtype is read with every scale 1."""
    extra = args.get("extra_cache_layout")
    if args.get("cache_layout") is None and extra is not None:
        cache = _decoded_as(args["extra_k_cache"], extra, "scale one")
        args["extra_k_cache"], args["extra_cache_layout"] = cache, None
    return args


def _relation(name: str, bug: str, fn, trap: str = "") -> Mutant:
    return Mutant(name, trap, bug, functools.partial(_entry, name, fn), twin=lambda: REFERENCE_ENTRY)


RELATION_MUTANTS = (
    _relation("window-needs-the-causal-flag", "the window applied only where causal=True is passed: a window "
              "passed with causal=False (it implies causal) masks nothing", through(_window_needs_the_causal_flag)),
    _relation("causal-by-identity", "`causal is True`: causal passed as a numpy bool masks nothing",
              through(_causal_by_identity)),
    _relation("scale-of-another-type-ignored", "a scale that is not a Python float (an int, a numpy float32) "
              "replaced by the default D ** -0.5", through(_scale_of_another_type_ignored)),
    _relation("window-of-another-type-ignored", "a window that is not a Python int (a numpy integer) dropped: the "
              "call masked as causal only", through(_window_of_another_type_ignored)),
    _relation("second-scope-scales-follow-the-first", "the tile scales applied under the first scope's layout: "
              "a quantized second scope beside a first in q's dtype read with every scale 1",
              through(_second_scope_scales_follow_the_first), trap="second-scope-quantized-alone"),
)
