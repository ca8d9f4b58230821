"""The sanitizer tier's plumbing, on the CPU with a stand-in for compute-sanitizer: one child
runs every paged and sparse case behind a marker line, and each report the tool prints is a
finding in the case before it, with the kernel's source line and the rerun command. (On an
H200 the real tool's memcheck found vLLM's read past its block table: BENCHMARKS.md.)"""

import os
import stat
import textwrap

import pytest

from fmha.ci import sanitize
from fmha.registry import KERNELS

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
    second = sanitize.cases(KERNELS["reference"], "cpu")[1]
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
