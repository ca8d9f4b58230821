"""The contract's arguments as data: one record per tensor argument of `attention` (dense and
contract v2) and of `merge`, with the storage a caller may give it.

`check_attention_args` and `check_merge_args` (fmha.contract.validation) stay the contract's
executable statement; these records say the same thing as data, so the draws (the storage each
tensor argument gets), the coverage audit (fmha.ci.coverage) and docs/contract.md's table come
from one place, and a test holds records and validator equal (tests/test_arguments.py). A
record's freedoms (`storage_freedoms`) are every storage form its rule allows, at the
granularity a kernel can get wrong:

- ``order:<dims>``: the non-last dims laid out in memory in another order, outermost first
  (``order:Hq.B.T``: head-major q);
- ``step:<dim>``: a slice with step 2 along a dim (a gap after each of its elements);
- ``offset``: the view starts past its buffer's first element;
- ``zero:<dim>``: stride 0 along a dim (broadcast), for an argument a kernel only reads;
- ``overlap:<dim>``: a stride along a dim smaller than what the dims inside it span, so that its
  elements share memory (an unfolded sliding window's chunks), for an argument a kernel only reads;
- ``alias:<other>``: two arguments are views of one buffer, neither the whole of it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

# Which calls an argument belongs to, in Capabilities.SOURCES' words plus "merge".
DENSE, PAGED, RAGGED, SPARSE, TWO_SCOPES = "dense", "paged", "ragged", "sparse", "two_scopes"


@dataclass(frozen=True)
class Argument:
    name: str
    shape: tuple[str, ...]  # the logical dims, in symbols (docs/contract.md)
    dtype: str  # what the validator takes
    calls: tuple[str, ...]  # the sources (or "merge") of the calls that take it
    optional: bool = False
    # The validator's storage rule: a contiguous last dim (stride 1), or any strides at all.
    contiguous_last: bool = True
    broadcast: bool = True  # stride 0 allowed: an argument the kernel only reads
    aliases: tuple[str, ...] = ()  # arguments it may share a buffer with (not as the same tensor)
    # Storage forms the record offers beyond the generic ones, or none at all: a quantized cache's
    # bytes are a page format (fmha.contract.cache_layouts), its freedoms the page stride only.
    fixed_format: bool = False
    values: str = ""  # the value domain
    relations: tuple[str, ...] = ()  # what it implies, requires or excludes

    @property
    def strided_dims(self) -> tuple[str, ...]:
        """The dims whose stride a caller chooses."""
        return self.shape[:-1] if self.contiguous_last else self.shape


def storage_freedoms(argument: Argument) -> tuple[str, ...]:
    """Every storage form `argument`'s rule allows a caller (module docstring)."""
    if argument.fixed_format:
        return (f"step:{argument.shape[0]}", "offset")
    dims = argument.strided_dims
    found = [f"order:{'.'.join(order)}" for order in itertools.permutations(dims) if order != dims]
    found += [f"step:{dim}" for dim in dims]
    found.append("offset")
    if argument.broadcast:
        found += [f"zero:{dim}" for dim in dims]
        # a dim overlaps what lies inside it: the contiguous last dim, or another strided dim
        found += [f"overlap:{dim}" for dim in (dims if argument.contiguous_last else dims[:-1])]
    found += [f"alias:{other}" for other in argument.aliases]
    return tuple(found)


_FLOAT = "q's dtype (bf16, fp16, fp32)"
_LENGTHS = "int32, contiguous"

ARGUMENTS: dict[str, Argument] = {a.name: a for a in (
    Argument("q", ("B", "T", "Hq", "D"), _FLOAT, (DENSE, PAGED, SPARSE), aliases=("k",),
             values="finite", relations=("Hq % Hkv == 0",)),
    Argument("q (ragged)", ("total_q", "Hq", "D"), _FLOAT, (RAGGED,), values="finite",
             relations=("with cu_seqlens_q",)),
    Argument("k", ("B", "S", "Hkv", "D"), _FLOAT, (DENSE,), aliases=("v",), values="finite, or NaN where no row "
             "sees the key", relations=("v is k: K = V (shared_kv)",)),
    Argument("v", ("B", "S", "Hkv", "Dv"), _FLOAT, (DENSE,), values="finite, or NaN where no row sees the key"),
    Argument("k cache", ("num_blocks", "block_size", "Hkv", "D"), _FLOAT, (PAGED, SPARSE), aliases=("v cache",),
             values="finite in the slots a row reads; anything elsewhere"),
    Argument("v cache", ("num_blocks", "block_size", "Hkv", "Dv"), _FLOAT, (PAGED,),
             values="finite in the slots a row reads; anything elsewhere", relations=("v is k for a quantized cache",)),
    Argument("quantized cache", ("num_blocks", "block_size", "1", "token_bytes"), "uint8 in a cache_layout",
             (PAGED, SPARSE), fixed_format=True, values="any bytes; NaN codes where no row reads",
             relations=("v is k", "bf16 q of head dim 512")),
    Argument("sink", ("Hq",), "float32", (DENSE, PAGED, SPARSE, "merge"), optional=True, contiguous_last=False,
             values="finite logits, or -inf"),
    Argument("out", ("B", "T", "Hq", "Dv"), "q's dtype", (DENSE, PAGED, SPARSE), optional=True, broadcast=False,
             values="written, every element; nothing around it", relations=("no alias with an input",)),
    Argument("out (ragged)", ("total_q", "Hq", "Dv"), "q's dtype", (RAGGED,), optional=True, broadcast=False,
             values="written, every element; nothing around it"),
    Argument("block_table", ("B", "max_blocks"), "int32", (PAGED,),
             values="page ids in [0, num_blocks) where kv_lens uses them; anything after",
             relations=("with kv_lens", "excludes indices")),
    Argument("kv_lens", ("B",), _LENGTHS, (PAGED,), broadcast=False,
             values="[0, max_blocks * block_size]", relations=("with block_table",)),
    Argument("cu_seqlens_q", ("B + 1",), _LENGTHS, (RAGGED,), broadcast=False,
             values="0, non-decreasing, total_q last", relations=("requires block_table",)),
    Argument("indices", ("B", "T", "topk"), "int32", (SPARSE,),
             values="slots in [0, num_blocks * block_size) or -1", relations=("excludes causal, window",)),
    Argument("topk_len", ("B",), _LENGTHS, (SPARSE,), optional=True, broadcast=False, values="[0, topk]"),
    Argument("extra_indices", ("B", "T", "extra_topk"), "int32", (TWO_SCOPES,),
             values="slots of extra_k_cache or -1", relations=("requires extra_k_cache",)),
    Argument("extra_topk_len", ("B",), _LENGTHS, (TWO_SCOPES,), optional=True, broadcast=False,
             values="[0, extra_topk]"),
    Argument("parts[i].o", ("B", "T", "H", "Dv"), _FLOAT, ("merge",), values="finite"),
    Argument("parts[i].lse", ("B", "H", "T"), "float32", ("merge",), contiguous_last=False,
             values="finite, or -inf for an empty part"),
)}


def markdown() -> str:
    """docs/contract.md's table of arguments, from the records."""
    from fmha.tables import Table

    table = Table(["argument", "shape", "dtype", "calls", "storage a caller may give it", "values"])
    for a in ARGUMENTS.values():
        rule = "a page format, its tokens packed: its page stride, an offset" if a.fixed_format else (
            ("last dim contiguous" if a.contiguous_last else "any strides")
            + ("" if a.broadcast else ", no stride 0") + "".join(f", may share a buffer with {o}" for o in a.aliases))
        table.add(f"`{a.name}`", f"({', '.join(a.shape)})", a.dtype, ", ".join(a.calls), rule,
                  a.values + "".join(f"; {r}" for r in a.relations))
    return table.markdown() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
