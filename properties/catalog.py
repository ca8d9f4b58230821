"""Every law of the contract, in one list: `LAWS`, by name. Adding a law is one decorated
function in dense_laws.py (dense keys) or paged_laws.py (paged and sparse caches): its test, the kill
matrix's columns, `fmha.ci.verify`'s fast pass and docs/laws.md follow from the record."""

from __future__ import annotations

import importlib

from fmha.properties.law_record import Law

# By import_module, not `from fmha.properties import dense_laws`: a session that unloaded the modules
# (pytester's in-process runs do) would find the package's stale attribute, whose records are
# of the old Law class.
MODULES = [importlib.import_module(f"fmha.properties.{name}") for name in ("dense_laws", "paged_laws")]
LAWS: dict[str, Law] = {law.name: law for module in MODULES for law in vars(module).values() if isinstance(law, Law)}



def markdown() -> str:
    """docs/laws.md: one row per law, from the records."""
    from fmha.tables import Table

    table = Table(["law", "what it says", "draws", "needs", "bitwise under", "proven on mutant", "test"])
    for law in LAWS.values():
        draws = law.draws if law.draws != "paged" else " or ".join(law.sources)
        table.add(f"`{law.name}`", law.summary, draws, ", ".join(law.needs) or "—", law.exact_under or "the verdict",
                  f"`{law.mutant}`", f"`{law.test}`")
    return ("# The laws\n\n"
            "Generated from the law records (`python -m fmha.properties.catalog > docs/laws.md`; "
            "tests/test_law_mutants.py checks it is current). Each law runs as its own test in "
            "properties/test_laws.py for every selected kernel that has what it needs, and is proven on its mutant "
            "(`--fmha-kernel mutant:NAME`, fmha.regressions.mutants) by tests/test_law_mutants.py.\n\n" + table.markdown() + "\n")


if __name__ == "__main__":
    print(markdown(), end="")
