"""The contract's relations as data: arguments whose meanings overlap or depend on each other, and
the types a scalar argument may come in, each with every way a caller may pass them together (its
forms). fmha.contract.arguments has each tensor argument's storage, fmha.contract.ranges the sizes.

A kernel goes wrong on a relation where it reads one argument as if the other said something it
does not say: a window applied only where causal=True is passed (a window implies causal), a scale
dropped because it is a numpy float, a second scope's cache decoded by the first's layout. So each
form is drawn (fmha.properties.strategies.call_forms, the covering set), and each is measured from
the call a kernel is handed (`shown`), never from what a strategy asked for: the coverage audit
(fmha.ci.coverage) lists the forms no call showed.
"""

from __future__ import annotations

from dataclasses import dataclass

from fmha.contract.arguments import DENSE, PAGED, SPARSE, TWO_SCOPES

# A second scope's layout beside the first's, as a kernel can get it wrong: a scope decoded by
# the other's layout, or scales applied under the other's.
SCOPE_LAYOUTS = ("neither quantized", "first only", "second only", "both alike", "both differ")


@dataclass(frozen=True)
class Relation:
    name: str
    arguments: tuple[str, ...]
    calls: tuple[str, ...]  # the sources of the calls it concerns (Capabilities.SOURCES' words)
    forms: tuple[str, ...]  # every way a caller may pass them, as `shown` names them
    meaning: str


RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("window implies causal", ("window", "causal"), (DENSE, PAGED), ("causal=True", "causal=False"),
             "a window makes the call causal whatever causal says"),
    Relation("causal's type", ("causal",), (DENSE, PAGED, SPARSE), ("bool", "numpy bool"),
             "True or False, a Python or a numpy bool"),
    Relation("window's type", ("window",), (DENSE, PAGED), ("int", "numpy integer"),
             "None, or an integer >= 1 of any integer type"),
    Relation("scale's type", ("scale",), (DENSE, PAGED, SPARSE), ("None", "float", "int", "numpy float"),
             "None (D ** -0.5), or a positive finite real of any real type"),
    Relation("v is k", ("k", "v"), (DENSE, PAGED), ("v is k", "v apart"),
             "one tensor for both (K = V), or two (which may share a buffer: their storage)"),
    Relation("each scope's topk_len", ("topk_len", "extra_topk_len"), (TWO_SCOPES,),
             ("both", "topk_len only", "extra_topk_len only", "neither"), "each scope's lengths given or not on its own"),
    Relation("each scope's cache layout", ("cache_layout", "extra_cache_layout"), (TWO_SCOPES,), SCOPE_LAYOUTS,
             "each scope's cache in q's dtype or a layout of its own"),
)}


def _type_name(value, numpy_name: str) -> str:
    return numpy_name if type(value).__module__ == "numpy" else type(value).__name__


def shown(call: dict) -> set[tuple[str, str]]:
    """(relation, form) for each relation the contract call `call` (its arguments by name) shows."""
    found = set()
    window, causal, scale = call.get("window"), call.get("causal", False), call.get("scale")
    if window is not None:
        found.add(("window implies causal", f"causal={bool(causal)}"))
        found.add(("window's type", _type_name(window, "numpy integer")))
    if "causal" in call:
        found.add(("causal's type", _type_name(causal, "numpy bool")))
    found.add(("scale's type", "None" if scale is None else _type_name(scale, "numpy float")))
    if call.get("indices") is None:
        found.add(("v is k", "v is k" if call["v"] is call["k"] else "v apart"))
    if call.get("extra_k_cache") is not None:
        given = (call.get("topk_len") is not None, call.get("extra_topk_len") is not None)
        found.add(("each scope's topk_len", {(True, True): "both", (True, False): "topk_len only",
                                             (False, True): "extra_topk_len only", (False, False): "neither"}[given]))
        first, second = call.get("cache_layout"), call.get("extra_cache_layout")
        found.add(("each scope's cache layout", scope_layouts(first, second)))
    return found


def scope_layouts(first: str | None, second: str | None) -> str:
    """The form of "each scope's cache layout" two scopes of these layouts show."""
    if first is None or second is None:
        return {(True, True): "neither quantized", (False, True): "first only", (True, False): "second only"}[
            (first is None, second is None)]
    return "both alike" if first == second else "both differ"


def markdown() -> str:
    """docs/contract.md's table of relations, from the records."""
    from fmha.tables import Table

    table = Table(["relation", "arguments", "calls", "a caller may pass", "meaning"])
    for r in RELATIONS.values():
        table.add(r.name, ", ".join(f"`{a}`" for a in r.arguments), ", ".join(r.calls), "; ".join(r.forms), r.meaning)
    return table.markdown() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
