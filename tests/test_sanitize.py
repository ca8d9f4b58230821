"""The sanitizer tier's plumbing, on the CPU with a stand-in for compute-sanitizer: one child
runs every named case behind a marker line, and each report the tool prints is a
finding in the case before it, with the kernel's source line and the rerun command. (On an
H200 the real tool's memcheck found vLLM's read past its block table: BENCHMARKS.md.)"""

import ast
import os
import re
import stat
import textwrap
from pathlib import Path

import pytest

from fmha.ci import sanitize
from fmha.kernels import gluon_dense
from fmha.regressions import ledger
from fmha.registry import KERNELS
from fmha.regressions.traps import laid_out_cases

pytestmark = pytest.mark.cpu_tier

REPORT = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    fmha-sanitize-case: last-partial-page/hd32-T2-S9
    ========= Invalid __global__ read of size 4 bytes
    =========     at kernel_unified_attention_2d+0x1c70 in /src/triton_unified_attention.py:123
    =========     by thread (3,0,0) in block (0,1,0)
    =========     Address 0x7f00 is out of bounds
    =========     and is 1 bytes after the nearest allocation at 0x7e00 of size 32 bytes
    ========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaFree.
    fmha-sanitize-case: zero-query-request/hd32-T1
    ========= Target application returned an error
    ========= ERROR SUMMARY: 1 error
""")


def test_a_report_is_a_finding_in_the_case_before_it_with_its_source_line():
    """(The API errors after an invalid access are its consequences, not findings of their own.)"""
    findings = sanitize.parse_report(REPORT, "vllm", "memcheck")
    assert len(findings) == 1
    assert findings[0].case == "last-partial-page/hd32-T2-S9"
    assert findings[0].what.startswith("Invalid __global__ read")
    assert findings[0].where == "kernel_unified_attention_2d at triton_unified_attention.py:123"


def test_every_case_runs_in_one_sanitized_child_and_its_finding_names_the_case(tmp_path):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(textwrap.dedent("""\
        #!/bin/bash
        # a stand-in: run the child after the options, report a read in the second case
        shift 4
        "$@" | awk '{print} /^fmha-sanitize-case: / {n++; if (n == 2) {
            print "========= Invalid __global__ read of size 4 bytes";
            print "=========     at _sources_fwd+0x10 in /x/triton_paged.py:77"}}'
        echo "========= ERROR SUMMARY: 1 error"
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    findings, refused = sanitize.sanitize(KERNELS["reference"], "memcheck", "cpu", str(fake), ())
    assert not refused and len(findings) == 1, (refused, findings)
    second = laid_out_cases(KERNELS["reference"], "cpu")[1]
    assert findings[0].case == f"{second[0]}/{second[1].id}"
    assert findings[0].where == "_sources_fwd at triton_paged.py:77"
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in findings[0].rerun and "--tool memcheck" in findings[0].rerun


def test_without_a_gpu_the_tier_says_so_and_skips(capsys):
    assert sanitize.main(["--fmha-device", "cpu", "--fmha-kernel", "reference"]) == 0
    assert "skipped: compute-sanitizer checks GPU kernels" in capsys.readouterr().out


READS_PAST = textwrap.dedent('''
    import torch, triton, triton.language as tl
    from fmha.oracles.reference_kernel import CAPABILITIES, reference

    @triton.jit
    def _read_past(T, OUT, n):
        tl.store(OUT, tl.load(T + n))  # the entry after the table's last, unmasked

    def one_past_the_table(q, k, v, *, block_table=None, **kwargs):
        if block_table is not None:
            out = torch.empty(1, dtype=block_table.dtype, device=block_table.device)
            _read_past[(1,)](block_table, out, block_table.numel())
        return reference(q, k, v, block_table=block_table, **kwargs)

    one_past_the_table.capabilities = CAPABILITIES
''')


@pytest.mark.gpu
@pytest.mark.nightly
def test_memcheck_finds_a_read_one_entry_past_the_block_table_at_its_source_line(tmp_path, monkeypatch):
    path, why = sanitize.sanitizer("cuda")
    if path is None:
        pytest.skip(why)
    (tmp_path / "reads_past.py").write_text(READS_PAST)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(tmp_path))
    from fmha.registry import resolve_kernel

    findings, refused = sanitize.sanitize(resolve_kernel("reads_past:one_past_the_table"), "memcheck", "cuda", path, ())
    if refused:
        pytest.skip(refused)
    assert findings and findings[0].what.startswith("Invalid __global__ read"), findings
    assert findings[0].where.endswith("reads_past.py:7"), findings[0]


def _line(code: str, file: str = "") -> str:
    """The `file:line` a racecheck record names for `code` (ledger.RACECHECK_LINES), so these
    reports follow the kernels' edits (a test below checks the code is still on that line)."""
    (line,) = [at for at, held in ledger.RACECHECK_LINES.items() if held == code and at.startswith(file)]
    return line


def test_a_race_is_matched_to_a_record_by_both_of_its_source_lines():
    read, write = _line("a_s.index(slot).load(ROW_PV)", "gluon_sparse.py"), _line("a_s.index(slot).store(alpha)")
    file, number = read.split(":")
    unrecorded = f"{file}:{int(number) + 1}"
    report = textwrap.dedent(f"""\
        fmha-sanitize-case: t/c
        ========= Error: Race reported between Read access at _sparse_fwd+0x1000 in /x/{read}
        =========     and Write access at _sparse_fwd+0xb720 in /x/{write} [4 hazards]
        ========= Error: Race reported between Read access at _sparse_fwd+0x1000 in /x/{unrecorded}
        =========     and Write access at _sparse_fwd+0xb720 in /x/{write} [4 hazards]
        """)
    findings = sanitize.parse_report(report, "gluon-sparse", "racecheck")
    assert [f.lines for f in findings] == [f"{read} <-> {write}", f"{unrecorded} <-> {write}"]
    assert ledger.known_failure(ledger.LEDGER, "gluon-sparse", "sanitize:racecheck", "cuda", findings[0].lines)
    assert not ledger.known_failure(ledger.LEDGER, "gluon-sparse", "sanitize:racecheck", "cuda", findings[1].lines)


# compute-sanitizer's racecheck report on fmha's CUDA kernel (an H200), at the current source's lines
_CUDA_READ, _CUDA_WRITE = _line("const float a0 = alpha_s[pb * ROWS + r0]"), _line("alpha_s[pb * ROWS + r0 + 8 * h] = alpha[h]")
_CUDA_RACE = ("Read access at void <unnamed>::second_half_warpgroup<(int)1>(const <unnamed>::Params &, unsigned "
              f"char *, int, int, int, int)+0x3dc0 in /x/{_CUDA_READ}",
              "and Write access at void <unnamed>::softmax_warpgroup<(int)1>(const <unnamed>::Params &, unsigned char "
              f"*, int, int, int, int)+0xc9a0 in /x/{_CUDA_WRITE} [496 hazards]")


@pytest.mark.parametrize("runner", ("cuda-sparse", "fmha"))  # fmha dispatches a sparse decode to it
@pytest.mark.parametrize("one_line", (False, True), ids=("continued", "one-line"))
def test_a_race_in_a_cuda_kernel_is_read_through_its_demangled_signatures(one_line, runner):
    """A CUDA C++ kernel's functions are named by their signatures, spaces and all: both source
    lines are read, and the ledger's record explains the report."""
    first, other = _CUDA_RACE
    body = f"{first} {other}" if one_line else f"{first}\n=========     {other}"
    findings = sanitize.parse_report(f"fmha-sanitize-case: t/c\n========= Error: Race reported between {body}\n",
                                     runner, "racecheck")
    assert [f.lines for f in findings] == [f"{_CUDA_READ} <-> {_CUDA_WRITE}"], findings
    assert ledger.known_failure(ledger.LEDGER, runner, "sanitize:racecheck", "cuda", findings[0].lines)


def test_a_built_kernel_names_its_lines_by_the_repository_file(tmp_path):
    """-lineinfo names a line by the file nvcc compiled: the build writes the .cu under its own
    name, so a report's "sparse_decode.cu:874" is the line the ledger and an author look at
    (under the extension's name, every record went stale on the GPU and nothing on the CPU said so)."""
    from fmha.kernels import build, cuda_sparse

    kernel = cuda_sparse.kernel_build()
    written = kernel.write_sources(tmp_path)
    assert written.name == Path(cuda_sparse.SOURCE).name
    assert written.read_text() == Path(cuda_sparse.SOURCE).read_text()
    assert build.kernel_only(kernel).write_sources(tmp_path / "alone").name == written.name


def test_a_race_in_a_kernel_without_line_info_names_both_accesses():
    report = textwrap.dedent("""\
        fmha-sanitize-case: t/c
        ========= Error: Race reported between Write access at k+0xd130
        =========     and Read access at k+0x6d10 [8 hazards]
        """)
    findings = sanitize.parse_report(report, "cuda-sparse", "racecheck")
    assert [f.what for f in findings] == [
        "Error: Race reported between Write access at k+0xd130 and Read access at k+0x6d10 [8 hazards]"]


def test_every_racecheck_record_names_lines_that_still_hold_its_code():
    """A record explains a report on two source lines: when a kernel edit moves the code, the
    record no longer matches, and this says which one to look at again."""
    kernels = Path(gluon_dense.__file__).parent
    for record in (r for r in ledger.LEDGER if r.test == "sanitize:racecheck"):
        for place in re.findall(r"\w+\.(?:py|cu):\d+", record.case):
            assert place in ledger.RACECHECK_LINES, f"{record.case}: {place} has no entry in ledger.RACECHECK_LINES"
    # A repeated key in the literal would keep only its last code: the first line would go unchecked.
    literal = next(node.value for node in ast.walk(ast.parse(Path(ledger.__file__).read_text()))
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "RACECHECK_LINES")
    keys = [key.value for key in literal.keys]
    assert len(keys) == len(set(keys)), f"ledger.RACECHECK_LINES names a line twice: {sorted(keys)}"
    for place, code in ledger.RACECHECK_LINES.items():
        file, line = place.split(":")
        held = next(kernels.rglob(file)).read_text().splitlines()[int(line) - 1]
        assert code in held, (f"{place} now reads {held.strip()!r}, not {code!r}: the racecheck records of "
                              "fmha.regressions.ledger name it; rerun python -m fmha.ci.sanitize --tool racecheck "
                              "on an H200 and move them")


def test_explained_findings_are_counted_and_an_unexplained_one_fails_the_run(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(textwrap.dedent("""\
        #!/bin/bash
        # a stand-in: the same explained race in every case, an unexplained one in the first
        shift 4
        "$@" | awk '{print} /^fmha-sanitize-case: / {n++;
            print "========= Error: Race reported between Read access at k+0x10 in /x/a.py:1";
            print "=========     and Write access at k+0x20 in /x/b.py:2 [4 hazards]";
            if (n == 1) {print "========= Error: Race reported between Read access at k+0x30 in /x/a.py:3";
                         print "=========     and Write access at k+0x40 in /x/b.py:4 [1 hazards]"}}'
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sanitize, "sanitizer", lambda device: (str(fake), ""))
    monkeypatch.setattr(ledger, "LEDGER", ledger.LEDGER + (ledger.KnownFailure(
        "reference", "sanitize:racecheck", "an ordering the tool does not model", "test", devices=("cpu",),
        case="a.py:1 <-> b.py:2"),))
    assert sanitize.main(["--fmha-device", "cpu", "--fmha-kernel", "reference", "--tool", "racecheck"]) == 1
    out = capsys.readouterr().out
    cases = len(laid_out_cases(KERNELS["reference"], "cpu"))
    assert f"known ({cases}x): reference, racecheck, a.py:1 <-> b.py:2: an ordering the tool does not model" in out
    assert out.count("FINDING: reference, racecheck") == 1 and "in k at b.py:4" in out
