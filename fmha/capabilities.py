"""What a kernel implements, as data, and the reasons it gives for what it does not.

Modelled on xformers' `not_supported_reasons` and PyTorch's OpInfo: tests never hold skip
logic of their own; they ask the kernel, and report its reasons as the skip message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from fmha.problem import DTYPE_NAMES, FEATURES, Problem

ALL_DTYPES = tuple(DTYPE_NAMES)


@dataclass(frozen=True)
class Capabilities:
    """The part of the contract a kernel implements. The defaults claim the whole contract."""

    head_dims: tuple[int, ...] | None = None  # None: any head dim
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    features: frozenset[str] = frozenset(FEATURES)
    max_q_len: int | None = None
    max_kv_len: int | None = None
    split_head_dim_v: bool = True  # Dv may differ from D
    empty_rows: bool = True  # rows that see no key give o = 0, lse = -inf / sink
    # Why a feature or limit is missing, e.g. {"lse": "SDPA's public API returns no LSE"}.
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"features: unknown {sorted(unknown)}; the contract's are {FEATURES}")

    def _why(self, key: str, default: str) -> str:
        note = self.notes.get(key)
        return f"{default} ({note})" if note else default

    def not_supported_reasons(
        self, problem: Problem, device: str, needs: Iterable[str] = ()
    ) -> list[str]:
        """Why this kernel cannot run `problem` on `device`; empty when it can.

        `needs` names per-call features the caller requires (``lse``, ``out``).
        """
        reasons = []
        if device not in self.devices:
            reasons.append(self._why("device", f"no {device} kernel (runs on {', '.join(self.devices)})"))
        if problem.dtype not in self.dtypes:
            names = ", ".join(DTYPE_NAMES[d] for d in self.dtypes)
            reasons.append(self._why("dtype", f"dtype {DTYPE_NAMES[problem.dtype]} unsupported (supports {names})"))
        if self.head_dims is not None and problem.head_dim not in self.head_dims:
            reasons.append(self._why("head_dim", f"head dim {problem.head_dim} unsupported (supports {_span(self.head_dims)})"))
        if self.head_dims is not None and problem.head_dim_v != problem.head_dim and problem.head_dim_v not in self.head_dims:
            reasons.append(self._why("head_dim", f"head dim v {problem.head_dim_v} unsupported"))
        if not self.split_head_dim_v and problem.head_dim_v != problem.head_dim:
            reasons.append(self._why("head_dim_v", "needs Dv == D"))
        for feature in sorted(problem.features | frozenset(needs)):
            if feature not in self.features:
                reasons.append(self._why(feature, f"no {feature} support"))
        if self.max_q_len is not None and problem.q_len > self.max_q_len:
            reasons.append(self._why("max_q_len", f"T={problem.q_len} > max {self.max_q_len}"))
        if self.max_kv_len is not None and problem.kv_len > self.max_kv_len:
            reasons.append(self._why("max_kv_len", f"S={problem.kv_len} > max {self.max_kv_len}"))
        if problem.has_empty_rows and not self.empty_rows:
            reasons.append(self._why("empty_rows", "rows with no visible key (causal, T > S) unsupported"))
        return reasons


def _span(values: tuple[int, ...]) -> str:
    """[64, 128] as is; an evenly spaced run as 'multiples of 8 from 8 to 256'."""
    steps = {b - a for a, b in zip(values, values[1:])}
    if len(values) > 4 and len(steps) == 1:
        return f"multiples of {steps.pop()} from {values[0]} to {values[-1]}"
    return str(list(values))


FULL_CONTRACT = Capabilities()


def always_available(device: str) -> str | None:
    return None


@dataclass(frozen=True)
class KernelEntry:
    """A kernel under test: a contract callable plus what it supports."""

    name: str
    fn: Callable
    capabilities: Capabilities = FULL_CONTRACT
    # Where one name covers different code per device (SDPA flash on CPU and on CUDA).
    device_capabilities: Mapping[str, Capabilities] = field(default_factory=dict)
    # Returns why the kernel cannot run on this machine at all (missing backend), or None.
    availability: Callable[[str], str | None] = always_available
    # Devices on which it runs when no --fmha-kernel is given (slow-to-compile ones opt out).
    default_devices: tuple[str, ...] = ("cpu", "cuda")
    description: str = ""

    def capabilities_on(self, device: str) -> Capabilities:
        return self.device_capabilities.get(device, self.capabilities)

    def not_supported_reasons(self, problem: Problem, device: str, needs: Iterable[str] = ()) -> list[str]:
        unavailable = self.availability(device)
        if unavailable:
            return [unavailable]
        return self.capabilities_on(device).not_supported_reasons(problem, device, needs)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


@dataclass(frozen=True)
class MergeEntry:
    """A D5 merge callable under test."""

    name: str
    fn: Callable
    devices: tuple[str, ...] = ("cpu", "cuda")
    description: str = ""

    def not_supported_reasons(self, device: str) -> list[str]:
        return [] if device in self.devices else [f"no {device} merge (runs on {', '.join(self.devices)})"]

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)
