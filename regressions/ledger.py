"""The known-failure ledger: each record says which kernel fails which test, why, and where
that was decided. Modelled on FlashInfer's fuzz ledger and PyTorch's xfail_strict.

The pytest plugin marks each matching test xfail(strict=True): an unexpected pass fails the
run and forces the record's removal. A record with `quarantine` is for a configuration that
crashes or hangs its process: the test is reported xfail without being launched. A law a
third-party kernel breaks is a finding recorded here, with its evidence; the law is never
weakened.

Kernel authors keep records for their own kernels in a TOML file of their own, passed with
`--fmha-known-failures FILE`, one `[[known_failure]]` table per record with the same fields
(kernel, test, reason and issue mandatory):

    [[known_failure]]
    kernel = "my_pkg.attn:fwd"
    test = "test_agrees_with_the_oracle"
    reason = "fp16 accumulation of q.k on the decode path: 5-14x the rounding floor"
    issue = "my_pkg#12"
    devices = ["cuda"]
    case = ""          # part of the test id it is limited to; empty: every case
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class KnownFailure:
    kernel: str  # registry name or plug-in path
    test: str  # test function name, e.g. "test_output_is_linear_in_v"
    reason: str  # what goes wrong, measured
    issue: str  # where it was decided, e.g. "fmha issue 4"
    devices: tuple[str, ...] = ("cpu", "cuda")
    evidence: str = ""  # the shrunk counterexample or measurement
    case: str = ""  # part of the test id it is limited to, e.g. "normalize-twice/"; empty: every case
    quarantine: bool = False  # crashes or hangs: never launched

    def __post_init__(self):
        for name in ("kernel", "test", "reason", "issue"):
            if not getattr(self, name).strip():
                raise ValueError(f"KnownFailure.{name} is mandatory")
        object.__setattr__(self, "devices", tuple(self.devices))


_NAN_LEAK = ("masked keys get weight 0 but their V still enters P.V, and 0 * NaN = NaN: a NaN in a "
             "value no query row can see (older than every row's window) reaches the output")

LEDGER: tuple[KnownFailure, ...] = (
    KnownFailure(
        "sdpa-math", "test_invisible_keys_and_storage_past_s_do_not_leak", _NAN_LEAK, "fmha issue 4",
        evidence="shrunk: Problem(batch=1, q_len=1, kv_len=2, heads_q=1, heads_kv=1, head_dim=16, "
                 "window=1, bf16): o is NaN in all 16 elements (torch 2.13 CPU, 2026-11-29; the same on an "
                 "H200, torch 2.11, 2026-12-01)",
    ),
    KnownFailure(
        "sdpa-paged", "test_invisible_keys_and_storage_past_s_do_not_leak", _NAN_LEAK, "fmha issue 4",
        evidence="its dense calls are sdpa-math's: the same one-row, two-key, window=1 case "
                 "(`python -m fmha.ci.verify --fmha-kernel sdpa-paged`, CPU, torch 2.13, 2026-12-01)",
    ),
    *(KnownFailure(
        name, "test_invisible_keys_and_storage_past_s_do_not_leak", _NAN_LEAK, "fmha issue 4", devices=("cuda",),
        evidence="the same one-row, two-key, window=1 case: o is NaN in all 16 elements "
                 "(`python -m fmha.ci.verify --fmha-device cuda`, an H200, torch 2.11, 2026-12-01)",
    ) for name in ("sdpa-efficient", "sdpa-cudnn", "flex")),
    KnownFailure(
        "sdpa-flash", "test_invisible_keys_and_storage_past_s_do_not_leak", _NAN_LEAK, "fmha issue 4",
        devices=("cpu",),
        evidence="shrunk: the same one-row, two-key, window=1 case (CPU flash kernel, torch 2.13, 2026-11-29)",
    ),
)


def load_known_failures(path: str) -> tuple[KnownFailure, ...]:
    """The records of a TOML known-failures file; a malformed one is a ValueError naming the
    file, the record and what is wrong."""
    try:
        with open(path, "rb") as f:
            tables = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"--fmha-known-failures {path}: {e}") from None
    extra = set(tables) - {"known_failure"}
    if extra:
        raise ValueError(f"--fmha-known-failures {path}: expected only [[known_failure]] tables, got {sorted(extra)}")
    fields = {f.name for f in dataclasses.fields(KnownFailure)}
    records = []
    for i, table in enumerate(tables.get("known_failure", [])):
        unknown = set(table) - fields
        if unknown:
            raise ValueError(f"--fmha-known-failures {path}: record {i + 1}: unknown field(s) {sorted(unknown)}; "
                             f"the fields are {', '.join(sorted(fields))}")
        try:
            records.append(KnownFailure(**table))
        except (TypeError, ValueError) as e:
            raise ValueError(f"--fmha-known-failures {path}: record {i + 1}: {e}") from None
    return tuple(records)


def known_failure(records, kernel: str, test: str, device: str, case_id: str = "") -> KnownFailure | None:
    for record in records:
        if (record.kernel == kernel and record.test == test and device in record.devices
                and record.case in case_id):
            return record
    return None
