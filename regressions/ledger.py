"""The known-failure ledger: each record says which kernel fails which test, why, and where
that was decided. Modelled on FlashInfer's fuzz ledger and PyTorch's xfail_strict.

The pytest plugin marks each matching test xfail(strict=True): an unexpected pass fails the
run and forces the record's removal. A record with `quarantine` is for a configuration that
crashes or hangs its process: the test is reported xfail without being launched. A law a
third-party kernel breaks is a finding recorded here, with its evidence; the law is never
weakened.

A finding in another library's kernel (FlashMLA, FlashInfer, vLLM through fmha's adapters)
names the library's version and its kind: a bug, a documented design choice, or unexplained
(measured, the cause not yet read from its sources).

Kernel authors keep records for their own kernels in a TOML file of their own, passed with
`--fmha-known-failures FILE`, one `[[known_failure]]` table per record with the same fields
(kernel, test, reason and issue mandatory):

    [[known_failure]]
    kernel = "my_pkg.attn:fwd"
    test = "test_agrees_with_the_oracle"
    reason = "fp16 accumulation of q.k on the decode path: 5-14x the rounding floor"
    issue = "my_pkg#12"
    devices = ["cuda"]
    case = ""          # the case's id it is limited to, exactly, or a glob ("trap/*", "*-bf16-*"); empty: every case
    seeds = "every"    # or "some": the failure shows only at some run seeds (values), so a pass is no error
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import fnmatch
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

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
    # The case it is limited to: its id exactly ("trap/case", a grid case, a sanitizer's line pair),
    # or a glob pattern over ids ("normalize-twice/*"); empty: every case. Never a substring: one
    # matched the ids of other cases that contain it (a case's twins re-laid for other kernels).
    case: str = ""
    quarantine: bool = False  # crashes or hangs: never launched
    # Another library's kernel: the version the finding was made on, and whether it is a bug, a
    # documented design choice, or not yet explained (measured, its cause not read).
    version: str = ""
    kind: str = ""  # "", "bug", "design" or "unexplained"
    # Every run draws new values (fmha.oracles.run_seed): "every" if the failure shows at every run
    # seed (an unexpected pass then fails the run), "some" if only some values show it (a pass is
    # reported as XPASS, not failed: no record removed by a lucky draw).
    seeds: str = "every"

    @property
    def identity(self) -> str:
        """How a report names the record: its kernel, test and case."""
        return f"kernel {self.kernel!r}, test {self.test!r}, case {self.case or '(every case)'!r}"

    def __post_init__(self):
        for name in ("kernel", "test", "reason", "issue"):
            if not getattr(self, name).strip():
                raise ValueError(f"KnownFailure.{name} is mandatory")
        if self.kind not in KINDS:
            raise ValueError(f"KnownFailure.kind: expected one of {', '.join(map(repr, KINDS))}, got {self.kind!r}")
        if self.seeds not in ("every", "some"):
            raise ValueError(f"KnownFailure.seeds: expected 'every' or 'some', got {self.seeds!r}")
        if self.kind and not self.version.strip():
            raise ValueError("KnownFailure.version: a finding in another library names the version it was made on")
        object.__setattr__(self, "devices", tuple(self.devices))


KINDS = ("", "bug", "design", "unexplained")


# Other libraries' kernels, through fmha's adapters (fmha/adapters/): what the suite found, with
# the command that shows it, on the version named.
LEDGER: tuple[KnownFailure, ...] = (
    KnownFailure(
        "flashmla", "test_named_regression_case", "NaN outputs where the float64 oracle (and fmha's kernels) are "
        "finite once the keys' ue8m0 tile scales are large: every key scaled by 2^32 (any input distribution but "
        "constant scores; 2^20 with large logits): 10752-17920 of 32768 elements NaN", "fmha issue 31",
        devices=("cuda",), case="large-key-scales/*", version="FlashMLA 9241ae3 (SM90 decode built from source)",
        kind="bug",
        evidence="python -m fmha.ci.verify --fmha-kernel flashmla --fmha-device cuda --only "
                 "large-key-scales/hd512-T2-topk6-sparse5-B2-mqa-h8-kv-shared-sink-bf16-dsv4-fp8-normal-seed1-cache2^32 "
                 "(re-laid as Hq 64, top-k 64 with topk_len 6); swept on an H200, torch 2.11, 2026-12-03: exponents "
                 "0-16 finite, 20-28 NaN with large logits, 32-104 NaN for every non-constant distribution; fmha "
                 "finite up to 104"),
    KnownFailure(
        "flashinfer-decode", "test_named_regression_case", "bf16 paged decode: the LSE is 1.5-2.1x past the LSE "
        "tolerance (3.0e-4 to 4.2e-4 against 2e-4, relative to max(1, |lse|)) while the output agrees; the same "
        "cases in fp16 pass. Cause not read from its sources yet", "fmha issue 31", devices=("cuda",), case="*-bf16-*",
        version="flashinfer-python 0.7.2.post1 (JIT-built with nvcc 13.0, use_tensor_cores=True)",
        kind="unexplained",
        evidence="python -m fmha.ci.verify --fmha-kernel flashinfer-decode --fmha-device cuda --law-examples 0 on an "
                 "H200, torch 2.11, 2026-12-03: the 7 bf16 paged named cases that run (re-laid as head dim 64, one "
                 "query row), e.g. batch-drops-last-key as hd64-T1-S9-paged4-B3-gqa2-h4-causal-bf16-normal-seed1-"
                 "kv_lens9.6.5: lse error 0.000304 at (b,h,t)=(0, 0, 0); flashinfer-prefill passes all 24 it runs"),
    *(KnownFailure(
        "sdpa-cudnn", test, "head dims 136 (bf16) and 216 (fp16) with large logits (|s| ~ 1e3, scale 1): rows "
        "of cosine -0.2 to 0.06 against the oracle, 1.4e3 units of rounding, as if q.k were held in 16 bits; "
        "the same calls at head dim 128 and 192, or with normal logits, pass. Cause not read", "fmha issue 59",
        devices=("cuda",), version="torch 2.11.0+cu130, cuDNN backend", kind="unexplained", seeds="some",
        evidence="pytest properties --fmha-device cuda --fmha-seed 20261206 on an H100, 2026-12-06: Sample(problem="
                 "Problem(batch=2, q_len=15, kv_len=15, heads_q=6, heads_kv=2, head_dim=136, causal=True, "
                 "shared_kv=True), scale=1.0, distribution='large_logits', run_seed=8886893392400025) fails with "
                 "K = V and with separate copies; hd216 fp16 batch 7, T = S = 33, seed 728 in the sequence law")
      for test in ("test_agrees_with_the_oracle", "test_calls_in_sequence_agree_with_the_oracle")),
)


# compute-sanitizer's racecheck on fmha's Gluon kernels (python -m fmha.ci.sanitize --tool racecheck,
# an H200, 2026-12-03): every report is one of three hand-offs through
# shared memory that the PTX memory model orders and racecheck does not model. A record names the
# two source lines of a report (read <-> write); tests/test_sanitize.py checks each line still holds
# the code the record is about, so a kernel edit that moves it asks for the record to be looked at.
_HANDOFF = ("racecheck does not model this ordering: warpgroup 0 stores to shared memory, every one of its 128 threads "
            "passes a named barrier (bar.sync 0, 128), then one elected thread arrives on an mbarrier that warpgroup 1 "
            "waits on before it loads; the arrive releases what the barrier ordered before it. A CUDA kernel with "
            "exactly this hand-off is reported the same way as one without the named barrier, so the report cannot "
            "tell them apart")
_WARP_SPECIALIZE = ("Triton's warp_specialize lowering, not the kernel's code: the default warps write the partition "
                    "state and captured arguments to shared memory (STS.64 at the kernel's def or warp_specialize "
                    "line) and the worker warps read them (LDS.U8 / LDS) on the other side of a CTA-wide "
                    "bar.sync 1, which orders them; seen in the SASS of both kernels (cuobjdump -sass)")
RACECHECK_LINES = {  # a record's source line -> the code that must still be on it
    "gluon_dense.py:147": "a_s.index(slot).store(alpha)",
    "gluon_dense.py:235": "a_s.index(slot).load(ROW_PV)",
    "gluon_sparse.py:323": "a_s.index(slot).load(ROW_PV)",
    "gluon_dense.py:177": "f_s.index(0).store(",
    "gluon_dense.py:178": "f_s.index(1).store(",
    "gluon_dense.py:244": "f_s.index(0).load(ROW_PV)",
    "gluon_sparse.py:331": "f_s.index(0).load(ROW_PV)",
    "gluon_dense.py:250": "def _attention_fwd(",
    "gluon_dense.py:314": "gl.warp_specialize(",
    "gluon_sparse.py:343": "def _sparse_fwd(",
    "gluon_sparse.py:397": "gl.warp_specialize(",
    "sparse_decode.cu:436": "reinterpret_cast<float*>(smem + OFF_BIAS)[stage * KEYS + key] =",
    "sparse_decode.cu:768": "const float2 bias = reinterpret_cast<const float2*>(bias_s + stage * KEYS)",
    "sparse_decode.cu:796": "alpha_s[pb * ROWS + r0 + 8 * h] = alpha[h]",
    "sparse_decode.cu:899": "const float a0 = alpha_s[pb * ROWS + r0]",
    "sparse_decode.cu:867": "final_s[r0 + 8 * h] = rescale[h]",
    "sparse_decode.cu:868": "final_s[ROWS + r0 + 8 * h] = denominator[h]",
    "sparse_decode.cu:917": "f[h] = final_s[r0 + 8 * h] / final_s[ROWS + r0 + 8 * h]",
    "sparse_decode.cu:109": 'asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"',
    "sparse_decode.cu:556": "bar_wait(free_bar + stage * 8, ((tile / STAGES) & 1) ^ 1);",
}
_RACES = (  # (first access, the other) -> why
    *((f"{read} <-> gluon_dense.py:147", "the tile's rescale alpha (a_s): " + _HANDOFF)
      for read in ("gluon_dense.py:235", "gluon_sparse.py:323")),
    *((f"{read} <-> gluon_dense.py:{line}", "the final row factors (f_s): " + _HANDOFF)
      for read in ("gluon_dense.py:244", "gluon_sparse.py:331") for line in (177, 178)),
    *((f"{entry} <-> {other}", _WARP_SPECIALIZE)
      for entry, other in (("gluon_dense.py:250", "gluon_dense.py:250"), ("gluon_dense.py:250", "gluon_dense.py:314"),
                           ("gluon_sparse.py:343", "gluon_sparse.py:343"), ("gluon_sparse.py:343", "gluon_sparse.py:397"))),
)
LEDGER += tuple(
    KnownFailure(kernel, "sanitize:racecheck", reason, "fmha issue 34", devices=("cuda",), case=pair,
                 evidence="python -m fmha.ci.sanitize --fmha-kernel fmha --fmha-kernel gluon --fmha-kernel gluon-sparse "
                          "--tool racecheck over every named case: each report on these lines (fmha 100, the print "
                          "limit; gluon 14; gluon-sparse 95); memcheck and synccheck 0 (an H200, torch 2.11, "
                          "triton 3.6.0, 2026-12-03)")
    for kernel in ("fmha", "gluon", "gluon-sparse") for pair, reason in _RACES)


# The same tool on fmha's CUDA sparse-decode kernel: about 100 reports over the kernel's named
# cases, on three hand-offs between warpgroups and the bf16 pass's barrier set-up, at these source lines (the extension is built
# with -lineinfo, so compute-sanitizer names them). Either order of a pair.
_CUDA_HANDOFFS = (
    ("sparse_decode.cu:436", ("sparse_decode.cu:768",),
     "the tile's 0 / -inf key row: warpgroup 0 loads it for tile i, passes barrier.sync 1, 128, and one thread "
     "arrives (release) on the stage's free mbarrier, whose completion the producer waits for (acquire) before it "
     "stores tile i + 2's row into the same stage; its own stores reach warpgroup 0 through barrier.sync 4, 128 and "
     "one thread's arrive on the ready mbarrier"),
    ("sparse_decode.cu:899", ("sparse_decode.cu:796",),
     "the tile's rescale factors: warpgroup 0 stores them, passes barrier.sync 1, 128, one thread arrives on the P "
     "buffer's full mbarrier, which warpgroup 1 waits for before it loads them; warpgroup 1 frees the buffer the "
     "same way (barrier.sync 3, 128, then an arrive) before warpgroup 0 stores into it two tiles later"),
    ("sparse_decode.cu:917", ("sparse_decode.cu:867", "sparse_decode.cu:868"),
     "the rows' final rescale and denominator: warpgroup 0 stores them, then both consumer warpgroups pass "
     "barrier.sync 2, 256 before warpgroup 1 loads them"),
    ("sparse_decode.cu:109", ("sparse_decode.cu:556",),
     "a lone CTA's barriers set up again for the bf16 pass (a row the f16 pass cannot hold: the large-key-scales "
     "case): thread 0 invalidates and initialises them after a CTA-wide bar.sync 0 that every thread reaches once "
     "its f16 pass is over, and before a second bar.sync 0 that the producer passes before it waits on the stage's "
     "free mbarrier"),
)
LEDGER += tuple(
    KnownFailure(kernel, "sanitize:racecheck", f"{why}. The named barrier (and the arrive after it) orders the accesses under the PTX memory model; racecheck does not model it",
                 "fmha issue 32", devices=("cuda",), case=pair,
                 evidence="python -m fmha.ci.sanitize --fmha-kernel cuda-sparse --tool memcheck --tool synccheck "
                          "--tool racecheck: racecheck 100 reports (9 on the 0 / -inf row, 30 at warpgroup 1's "
                          "loads of the rescale factors, 60 at its loads of the final factors, 1 on the bf16 pass's "
                          "barrier set-up), each naming two of these lines; memcheck and synccheck 0 (an H200, "
                          "torch 2.11, 2026-12-04)")
    for kernel in ("fmha", "cuda-sparse")  # fmha runs this kernel for a sparse decode where it is built
    for first, others, why in _CUDA_HANDOFFS for other in others
    for pair in (f"{first} <-> {other}", f"{other} <-> {first}"))


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
    tests = suite_tests()
    for i, record in enumerate(records):
        if record.test not in tests and not record.test.startswith(("sanitize:", "nightly:")):
            near = difflib.get_close_matches(record.test, tests, n=3, cutoff=0.6)
            raise ValueError(f"--fmha-known-failures {path}: record {i + 1}: test {record.test!r} names no test of "
                             f"fmha's suite, so it would never apply" + (f"; did you mean {', '.join(near)}?" if near
                                                                        else "; `pytest --pyargs fmha --co -q` lists them"))
    return tuple(records)


def suite_tests() -> set[str]:
    """The names of the test functions of fmha's suite, which a record names (besides the
    sanitizer's `sanitize:TOOL`): one per law, and the `def test_...` of its test modules (read,
    not imported: importing them loads Triton, which a process loads once)."""
    from fmha.properties.catalog import LAWS

    names = {law.test for law in LAWS.values()}
    for package in ("fmha.properties", "fmha.regressions"):
        for folder in importlib.util.find_spec(package).submodule_search_locations:
            for path in Path(folder).glob("test_*.py"):
                names |= {node.name for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return names


def known_failure(records, kernel: str, test: str, device: str, case_id: str = "") -> KnownFailure | None:
    """The record of `kernel` failing `test` on `device` for the case `case_id` (its id exactly, or
    by the record's glob pattern), or None."""
    for record in records:
        if (record.kernel == kernel and record.test == test and device in record.devices
                and (not record.case or fnmatch.fnmatchcase(case_id, record.case))):
            return record
    return None
