"""An attention problem: the shapes and contract features of one call, without the data.

Kernels declare what they support against this type, tests name themselves after it, and
the oracles take the tensors it describes. Keyword-only: `Problem(batch=1, q_len=9, ...)`
reads as the case, where `Problem(1, 9, 5, 2, 1, 64)` needs the field order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

# The optional parts of the contract a kernel may or may not implement (docs/contract.md).
FEATURES = ("causal", "window", "sink", "lse", "gqa", "shared_kv", "out")

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True, kw_only=True)
class Problem:
    batch: int
    q_len: int  # T
    kv_len: int  # S
    heads_q: int
    heads_kv: int
    head_dim: int  # D, of q and k
    head_dim_v: int | None = None  # Dv; None means equal to head_dim
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    window: int | None = None  # implies causal
    sink: bool = False
    shared_kv: bool = False  # k and v are one tensor (DSV4: K = V)

    def __post_init__(self):
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)
        if self.window is not None:
            object.__setattr__(self, "causal", True)
        if self.shared_kv and self.head_dim_v != self.head_dim:
            raise ValueError(f"shared_kv needs head_dim_v == head_dim, got {self.head_dim_v} != {self.head_dim}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}")

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads_q // self.heads_kv

    @property
    def layout(self) -> str:
        if self.heads_kv == self.heads_q:
            return "mha"
        if self.heads_kv == 1:
            return "mqa"
        return f"gqa{self.group}"

    @property
    def features(self) -> frozenset[str]:
        """Contract features this problem exercises (lse and out are per call, not per problem)."""
        used = set()
        if self.causal:
            used.add("causal")
        if self.window is not None:
            used.add("window")
        if self.sink:
            used.add("sink")
        if self.heads_q != self.heads_kv:
            used.add("gqa")
        if self.shared_kv:
            used.add("shared_kv")
        return frozenset(used)

    @property
    def has_empty_rows(self) -> bool:
        """Some query row sees no key: masked and T > S (row i sits at S - T + i < 0)."""
        return self.causal and self.q_len > self.kv_len

    @property
    def id(self) -> str:
        """Reads as the case, e.g. ``hd512-T4-S640-mqa-kv-shared-window128-sink-bf16``."""
        parts = [f"hd{self.head_dim}"]
        if self.head_dim_v != self.head_dim:
            parts.append(f"dv{self.head_dim_v}")
        parts += [f"T{self.q_len}", f"S{self.kv_len}"]
        if self.batch != 1:
            parts.append(f"B{self.batch}")
        parts.append(f"{self.layout}-h{self.heads_q}")
        if self.shared_kv:
            parts.append("kv-shared")
        if self.window is not None:
            parts.append(f"window{self.window}")
        elif self.causal:
            parts.append("causal")
        if self.sink:
            parts.append("sink")
        parts.append(DTYPE_NAMES[self.dtype])
        return "-".join(parts)

    def replace(self, **changes) -> Problem:
        """A copy with `changes`; where Dv equals D, a new head_dim changes both."""
        if "head_dim" in changes and "head_dim_v" not in changes and self.head_dim_v == self.head_dim:
            changes["head_dim_v"] = None
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        """Only what differs from the defaults: a line to paste into @example or a trap."""
        return f"Problem({repr_fields(self, head_dim_v=self.head_dim, causal=self.window is not None)})"


def repr_fields(obj, **implied) -> str:
    """`name=value` for the dataclass fields of `obj` that differ from their defaults (or from
    what `implied` says they follow from)."""
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = implied.get(f.name, f.default)
        if f.default is dataclasses.MISSING or value != default:
            parts.append(f"{f.name}={value!r}")
    return ", ".join(parts)
