"""Every mutant, by name: the one registry of `Mutant` records (fmha.regressions.mutation).

A mutant is a kernel with one known bug and what proves the suite catches it: the trap whose
cases must fail it, the laws that name it (`Law.mutant`), the GPU tests of the kernel it was
patched from. They come from

- the trap library (each trap module's MUTANTS; a kernel author's `--fmha-cases DIR` adds
  theirs when it loads),
- fmha.regressions.eager_mutants (the dense laws'), fmha.regressions.paged_mutants (contract
  v2's, some of them a trap's too), fmha.regressions.shipped_mutants (bugs public kernels
  shipped, each with its source), fmha.regressions.storage_mutants (storage forms of the
  argument records read wrong), fmha.regressions.range_mutants (sizes past a point handled wrong),
  fmha.regressions.production_mutants (right under test, wrong where production calls),
  fmha.regressions.scale_mutants (past sizes only the GPU scale tier draws),
- fmha.regressions.gluon_mutants and fmha.regressions.cuda_mutants (Hopper only).

Any of them runs as a kernel, by one spelling: `--fmha-kernel mutant:NAME`.
"""

from __future__ import annotations

import difflib
from typing import Iterator, Mapping

from fmha.regressions import (cuda_mutants, eager_mutants, gluon_mutants, paged_mutants, production_mutants,
                              range_mutants, relation_mutants, scale_mutants, shipped_mutants, storage_mutants, traps)
from fmha.regressions.mutation import Mutant

FAMILIES = (eager_mutants.EAGER_MUTANTS, paged_mutants.PAGED_MUTANTS, shipped_mutants.SHIPPED_MUTANTS,
            storage_mutants.STORAGE_MUTANTS, range_mutants.RANGE_MUTANTS,
            relation_mutants.RELATION_MUTANTS, production_mutants.PRODUCTION_MUTANTS, scale_mutants.SCALE_MUTANTS,
            gluon_mutants.GLUON_DENSE_MUTANTS, gluon_mutants.GLUON_SPARSE_MUTANTS, cuda_mutants.CUDA_MUTANTS)


class _Registry(Mapping):
    """Name -> Mutant, read when asked, so that traps loaded later (--fmha-cases) are in it. A
    record may be listed twice (a paged mutant is also its trap's); two records of one name are
    an error."""

    def _records(self) -> dict[str, Mutant]:
        found: dict[str, Mutant] = {}
        for mutant in (*(m for family in FAMILIES for m in family),
                       *(m for mutants in traps.MUTANTS_OF.values() for m in mutants)):
            if found.setdefault(mutant.name, mutant) is not mutant:
                raise ValueError(f"two mutants are named {mutant.name!r}: {found[mutant.name]!r} and {mutant!r}")
        return found

    def __getitem__(self, name: str) -> Mutant:
        return self._records()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records())

    def __len__(self) -> int:
        return len(self._records())


MUTANTS: Mapping[str, Mutant] = _Registry()


def mutant(name: str) -> Mutant:
    """The mutant named `name`; an unknown name is a ValueError listing the nearest ones."""
    records = dict(MUTANTS)
    if name not in records:
        near = difflib.get_close_matches(name, records, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join('mutant:' + n for n in near)}?" if near else (
            "`python -m fmha.regressions list` shows every trap's; the registry has " + ", ".join(sorted(records)))
        raise ValueError(f"mutant:{name}: no mutant is named {name!r}; {hint}")
    return records[name]


def trap_mutants() -> dict[str, Mutant]:
    """Every trap's mutants, by name, in the library's order: the kill matrix's rows."""
    return {m.name: m for mutants in traps.MUTANTS_OF.values() for m in mutants}
