"""The covering array: every pair of (argument, freedom) values a kernel's declaration allows
meets in some call of every run.

The covering set (fmha.properties.covering) gives each freedom of each record to some call; a
bug that shows only where two freedoms meet (q head-major beside a k cache sliced along its
pages, a numpy scale beside a window passed with causal=False, a second scope's layout beside
the first's) needs the two in one call. The factors are the records' freedoms for each source of
calls: each tensor argument's storage forms (`storage_variants`, from
fmha.contract.arguments), the relations' forms (fmha.contract.relations: K = V, scalar forms,
each scope's layout and lengths) and the declared features (dtype, mask, sink, GQA). `covertable`
builds a strength-2 array over them, constrained by the kernel's declaration and the contract's
rules; its structure is fixed, the values inside each row (tensors, each request's lengths) come
from the run seed. A call is small (a few rows, keys and heads): what it costs is its layout's.
Building an array takes seconds; it is kept under $FMHA_CACHE_DIR (else ~/.cache/fmha), keyed by
everything it is built from.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
from importlib.metadata import version
from pathlib import Path

from covertable import make

from fmha.contract import DTYPE_NAMES, Capabilities, Problem
from fmha.contract.arguments import ARGUMENTS, storage_freedoms
from fmha.oracles.hazards import hostile
from fmha.oracles.sample import OTHER_ARGUMENTS, SCALAR_FORMS, Sample
from fmha.oracles.storage import record
from fmha.properties.strategies import round_up

STRENGTH = 2
UNQUANTIZED = "q's dtype"  # a cache's layout factor: no quantized layout
NO_SCOPE = "none"  # the second scope's layout factor: one scope only
CACHE_ENV = "FMHA_CACHE_DIR"  # where built arrays are kept (else ~/.cache/fmha): one build a machine
PACKED = ""  # a storage factor's value in a call without the argument (the covering set has each packed)


def rows_for(caps: Capabilities, prefer: int) -> int:
    """Query rows a request: `prefer`, or the most a kernel declares (a decode kernel's one)."""
    return min(prefer, caps.max_q_len or prefer)


def lengths_for(caps: Capabilities, q_len: int, kv_len: int) -> tuple[int, int]:
    """Query rows and keys near (`q_len`, `kv_len`) where a dense kernel's shape relations put
    them: multiples of what it declares, T = S for a square prefill (the keys', rounded to both)."""
    if caps.q_len_equals_kv_len:
        n = round_up(kv_len, math.lcm(caps.q_len_multiple_of, caps.kv_len_multiple_of))
        return n, n
    return round_up(q_len, caps.q_len_multiple_of), round_up(kv_len, caps.kv_len_multiple_of)


def head_dim_for(caps: Capabilities, dtype) -> int | None:
    """The head dim nearest 64 the kernel declares in `dtype` (None: none in it)."""
    dims = caps.head_dims_for(dtype)
    if dims is None:
        return 64
    return min(dims, key=lambda d: abs(d - 64)) if dims else None


def block_size_for(caps: Capabilities, prefer: int) -> int:
    return prefer if caps.block_sizes is None or prefer in caps.block_sizes else min(caps.block_sizes)


def storage_variants(argument) -> list[str]:
    """Forms of `argument` that together show each of its record's freedoms: each other memory
    order with a step along every dim and an offset; stride 0 along every dim (it may take);
    elements sharing memory along every dim (it may take); each buffer it may share (with a step)."""
    free = storage_freedoms(argument)
    steps = [f for f in free if f.startswith(("step:", "offset"))]
    orders = [f for f in free if f.startswith("order:")]
    offset = ["offset"] if "offset" in free else []
    # stride 0 first: the family's first sample (its plainest) has every dim past 1, where it shows
    variants = ["+".join([*those, *offset]) for kind in ("zero:", "overlap:")
                if (those := [f for f in free if f.startswith(kind)])]
    variants += ["+".join([order, *steps]) for order in orders] or ["+".join(steps)]
    variants += [f"{f}+{steps[0]}" if steps else f for f in free if f.startswith("alias:")]
    return [v for v in variants if v]


def _structure(caps: Capabilities, source: str) -> dict[str, list[str]]:
    """The declared features and relations of a call of `source`, each with the values `caps`
    lets a call take."""
    dtypes = [DTYPE_NAMES[d] for d in caps.dtypes if caps.head_dims_for(d) != ()]
    found = {"dtype": dtypes}
    if source != "sparse":
        masks = ["none", "causal", "window"]
        found["mask"] = [m for m in masks if (m == "none" or m in caps.features) and not (
            ("causal" in caps.requires and m == "none") or ("window" in caps.requires and m != "window"))]
    found["sink given"] = [s for s in ("no", "yes") if (s == "yes") == ("sink" in caps.requires) or (
        "sink" in caps.features and "sink" not in caps.requires)]
    found["group"] = ["1", "3"] if "gqa" in caps.features else ["1"]
    found["scalars"] = [PACKED, *SCALAR_FORMS]
    if source != "sparse":
        shared = "shared_kv" in caps.features
        found["v is k"] = ["yes"] if "shared_kv" in caps.requires else (["no", "yes"] if shared else ["no"])
    layouts = sorted(caps.cache_layouts) if "shared_kv" in caps.features else []
    if source == "paged":
        found["queries"] = ["padded", "ragged"] if "ragged" in caps.sources else ["padded"]
    if source != "dense":
        found["layout"] = ([UNQUANTIZED] if caps.unquantized_caches else []) + layouts
    if source == "sparse":
        found["topk_len given"] = ["yes", "no"]
        if "two_scopes" in caps.sources:
            found["second scope"] = [NO_SCOPE, *found["layout"]]
            found["extra_topk_len given"] = ["yes", "no"]
    return found


def _problem(caps: Capabilities, source: str, row: dict) -> Problem:
    """The small call of a row's structure: 2 or 3 requests, a few rows, keys and heads (T = S
    for dense calls: q may share k and v's buffer)."""
    dtype = next(d for d in caps.dtypes if DTYPE_NAMES[d] == row["dtype"])
    layout = None if row.get("layout", UNQUANTIZED) == UNQUANTIZED else row["layout"]
    second = row.get("second scope", NO_SCOPE)
    quantized = layout is not None or second not in (NO_SCOPE, UNQUANTIZED)
    group = int(row["group"])
    heads_kv = 1 if quantized else 2
    head_dim = 512 if quantized else head_dim_for(caps, dtype)
    heads_q = group * heads_kv if caps.heads_q is None else min(caps.heads_q)
    heads_kv = heads_kv if caps.heads_q is None else (heads_q // group if heads_q % group == 0 else heads_q)
    mask = row.get("mask", "none")
    fields = dict(heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype, causal=mask != "none",
                  window=2 if mask == "window" else None, sink=row["sink given"] == "yes",
                  shared_kv=quantized or source == "sparse" or row.get("v is k") == "yes")
    if source == "dense":
        q_len, kv_len = lengths_for(caps, rows_for(caps, 7), rows_for(caps, 7))
        return Problem(batch=2, q_len=q_len, kv_len=kv_len, **fields)
    if source == "paged":
        block_size = block_size_for(caps, 4)
        return Problem(batch=3, q_len=rows_for(caps, 3), kv_len=2 * block_size + 1, source="paged", block_size=block_size,
                       ragged=row["queries"] == "ragged", cache_layout=layout, **fields)
    topk = -(-8 // caps.topk_multiple_of) * caps.topk_multiple_of
    extra = {} if second == NO_SCOPE else dict(
        extra_topk=topk, extra_block_size=block_size_for(caps, 4),
        extra_cache_layout=None if second == UNQUANTIZED else second)
    return Problem(batch=2 if second == NO_SCOPE else 3, q_len=rows_for(caps, 2), kv_len=topk, source="sparse",
                   block_size=block_size_for(caps, 16), cache_layout=layout, **fields, **extra)


def _sample(caps: Capabilities, source: str, row: dict, seed: int, draw: random.Random | None = None) -> Sample:
    """A row's call: its structure, its storage forms, each request's lengths from `draw` (the
    first request's at the problem's maxima), no hazard laid in yet."""
    p = _problem(caps, source, row)
    draw = draw or random.Random(0)
    lengths = {}
    if source == "paged":
        # a full last page, a partial one (a request without rows where declared: keys no row sees
        # past the first page, which every request shares), fewer keys than rows where declared
        fewer = caps.empty_rows and not caps.q_len_at_most_kv_len and p.q_len > 1
        last = draw.randint(1, p.q_len - 1) if fewer else draw.randint(p.q_len, p.kv_len)
        lengths.update(kv_lens=(p.block_size, p.kv_len, last), shared_pages=True)
        if p.ragged:
            lengths["q_lens"] = (draw.randint(1, p.q_len), 0 if caps.empty_query_requests else 1, p.q_len)
    if source == "sparse":
        # the second request reads nothing (where declared) of each scope whose lengths are given;
        # with both given, the first reads the first scope alone, the second the second alone, the
        # third nothing
        given = [row.get(f"{name} given") == "yes" and upper is not None
                 for name, upper in (("topk_len", p.kv_len), ("extra_topk_len", p.extra_topk))]
        least, least_extra = (0, 0) if caps.empty_rows else (p.kv_len, p.extra_topk)
        if all(given):
            lengths.update(topk_lens=(p.kv_len, least, least),
                           extra_topk_lens=(least_extra, draw.randint(1, p.extra_topk), least_extra))
        elif any(given):
            name, upper = ("topk_lens", p.kv_len) if given[0] else ("extra_topk_lens", p.extra_topk)
            lengths[name] = (upper, 0 if caps.empty_rows else upper, draw.randint(2, upper))[:p.batch]
    forms = {name: row.get(name, PACKED) for name in ("q", "k", "v", *OTHER_ARGUMENTS)}
    scalars = () if row.get("scalars", PACKED) == PACKED else (row["scalars"],)
    return Sample(problem=p, seed=seed, scale=1.0 if scalars == ("int scale",) else None, scalars=scalars,
                  q_storage=forms["q"], k_storage=forms["k"], v_storage=forms["v"],
                  storage=tuple((n, forms[n]) for n in OTHER_ARGUMENTS),
                  invalid=0.1 if source == "sparse" else 0.0, repeats=0.25 if source == "sparse" else 0.0,
                  last_slot=source == "sparse",
                  outliers=bool(p.cache_layouts), **lengths)


def _forms(sample: Sample) -> dict[str, list[str]]:
    """The storage forms each tensor argument of `sample`'s call may take: its record's
    (`storage_variants`), but a buffer shared with another argument the
    call lays out apart (v with k where K = V; q with k and v unless one KV head serves one query
    head and T = S)."""
    p = sample.problem
    found = {}
    for name in ("q", "k", "v", *OTHER_ARGUMENTS):
        if not sample.takes(name):
            continue
        qkv = p.source == "dense" and not p.shared_kv and p.group == 1 and p.q_len == p.kv_len
        found[name] = [f for f in storage_variants(record(name, p)) if not (
            ("alias:k" in f.split("+") and not qkv) or (p.shared_kv and "alias:v" in f))] or [PACKED]
    return found


def _realized(row: dict, sample: Sample) -> bool:
    """Whether `sample`'s call is what each of `row`'s values says (a quantized cache is K = V
    whatever the row's "v is k"; a call of one scope has no second lengths argument): one
    structure a call, so that a value's pairs are met where the value means something."""
    p = sample.problem
    return (row.get("v is k", "yes" if p.shared_kv else "no") == ("yes" if p.shared_kv else "no")
            and (row.get("topk_len given", "no") == "yes") == (sample.topk_lens is not None)
            and (row.get("extra_topk_len given", "no") == "yes") == (sample.extra_topk_lens is not None))


_STRUCTURES: dict[tuple, _Structures] = {}


def _structures(kernel, device: str, source: str) -> _Structures:
    """`_Structures` once a process for everything they are made from: the declaration and every
    record's drawn freedoms (a test that takes one out gets others)."""
    caps = kernel.capabilities_on(device)
    at = (repr(caps), device, source, repr([storage_freedoms(argument) for argument in ARGUMENTS.values()]))
    if at not in _STRUCTURES:
        _STRUCTURES[at] = _Structures(kernel, device, source)
    return _STRUCTURES[at]


class _Structures:
    """The structures a kernel's declaration takes (its calls but for their storage), each with
    the forms each argument may take there: the array's factors and constraints."""

    def __init__(self, kernel, device: str, source: str):
        caps = kernel.capabilities_on(device)
        factors = _structure(caps, source)
        scalars = factors.pop("scalars")
        self.keys = [*factors, "scalars"]
        self.forms: dict[tuple, dict[str, list[str]]] = {}
        for values in itertools.product(*factors.values()):
            row = dict(zip(factors, values))
            try:
                sample = _sample(caps, source, row, 0)
            except ValueError:  # the contract has no such call (a quantized cache of fp16 queries)
                continue
            if kernel.not_supported_reasons(sample.problem, device) or not _realized(row, sample):
                continue
            forms = _forms(sample)
            for form in scalars:  # causal=False: a window's; the other forms fit any call
                if form != "causal=False" or sample.problem.window is not None:
                    self.forms[(*values, form)] = forms
        self.factors = {k: [v for v in vs if any(s[i] == v for s in self.forms)]
                        for i, (k, vs) in enumerate({**factors, "scalars": scalars}.items())}
        for forms in self.forms.values():
            for name, mine in forms.items():
                known = self.factors.setdefault(name, [])
                known += [f for f in mine if f not in known]
        for name, known in self.factors.items():  # absent from some call: packed there
            if name not in self.keys and any(name not in forms for forms in self.forms.values()):
                known.insert(0, PACKED)

    @functools.cached_property
    def rows(self) -> tuple[dict, ...]:
        """The array: built once for each declaration and records (a mutant's declaration is its
        twin's), kept on disk too, so that pytest's workers and nested sessions build it once
        between them."""
        key = hashlib.sha256(repr((version("covertable"), STRENGTH, self.factors,
                                   sorted(self.forms.items()))).encode()).hexdigest()[:32]
        path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fmha") / "covering-arrays" / f"{key}.json"
        try:
            return tuple(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
        made = make(self.factors, strength=STRENGTH, constraints=self.constraints()) if self.forms else []
        rows = [row for row in made if self.admits(row)]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}")
            partial.write_text(json.dumps(rows))
            os.replace(partial, path)  # whole or not at all, whoever writes last
        except OSError:
            pass  # a read-only home: built again next time
        return tuple(rows)

    def pairs(self) -> dict[tuple[str, str], set[tuple[str, str]]]:
        """Each pair of factors -> the pairs of their values some declared call has."""
        met: dict[tuple[str, str], set] = {}
        for structure, forms in self.forms.items():
            found = {**dict(zip(self.keys, structure)), **forms}
            for a, b in itertools.combinations(self.factors, 2):
                met.setdefault((a, b), set()).update(itertools.product(_listed(found.get(a, PACKED)),
                                                                       _listed(found.get(b, PACKED))))
        return met

    def constraints(self) -> list[dict]:
        """covertable's: each pair of factors' values as some declared call has them, for the pairs
        some call cannot have. A constraint over a whole row would be exact, but covertable looks
        ahead through every one it is given for each pair: pairs keep it to seconds (`admits`
        checks each row after)."""
        return [{"operator": "fn", "requires": [a, b], "evaluate": lambda row, a=a, b=b, pairs=pairs: (
            (row[a], row[b]) in pairs)} for (a, b), pairs in self.pairs().items()
            if len(pairs) < len(self.factors[a]) * len(self.factors[b])]

    def admits(self, row: dict) -> bool:
        """Whether `row` is a declared call, each argument in a form its structure allows (packed
        where the call has no such argument)."""
        forms = self.forms.get(tuple(row[k] for k in self.keys))
        return forms is not None and all(row[name] in forms.get(name, (PACKED,)) for name in self.factors
                                         if name not in self.keys)


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _rows_of(kernel, device: str, source: str) -> tuple[dict, ...]:
    """The array's rows for `kernel`'s calls of `source` (`_Structures.rows`)."""
    return _structures(kernel, device, source).rows


def array(kernel, device: str, seed: int = 0) -> list[Sample]:
    """The covering array's calls for `kernel` on `device`: each source it declares, a row a call."""
    caps = kernel.capabilities_on(device)
    found = []
    for source in ("dense", "paged", "sparse"):
        if source in caps.sources:
            draw = random.Random(f"{seed}:{source}")
            found += [hostile(_sample(caps, source, dict(row), seed, draw), caps) for row in _rows_of(kernel, device, source)]
    return found


def factors(kernel, device: str, source: str) -> dict[str, list[str]]:
    """The array's factors for `kernel`'s calls of `source`, each with the values its declaration allows."""
    return _structures(kernel, device, source).factors


def size(kernel, device: str) -> dict[str, int]:
    """Rows a source: the calls the array adds to a run."""
    return {source: len(_rows_of(kernel, device, source)) for source in ("dense", "paged", "sparse")
            if source in kernel.capabilities_on(device).sources}


def uncovered(kernel, device: str, source: str) -> list[str]:
    """Pairs of factor values some call `kernel` declares has that no row of its array has."""
    met = {(a, row[a], b, row[b]) for row in _rows_of(kernel, device, source) for a, b in itertools.permutations(row, 2)}
    return [f"{a}={x!r} with {b}={y!r}" for (a, b), pairs in _structures(kernel, device, source).pairs().items()
            for x, y in sorted(pairs) if (a, x, b, y) not in met]
