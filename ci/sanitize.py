"""The sanitizer tier (GPU): every named case under NVIDIA's compute-sanitizer.

    python -m fmha.ci.sanitize                                  # fmha's kernels: memcheck, synccheck
    python -m fmha.ci.sanitize --fmha-kernel my_pkg.attn:fwd --tool memcheck --tool racecheck
    python -m fmha.ci.sanitize --json sanitize.json
    python -m fmha.ci.sanitize --shard 2/4 --json sanitize.json  # one runner of four (every 4th case from the 2nd)

Output comparisons cannot see a kernel read what the call does not name (an unmasked load one
entry past a block table reads memory nobody owns and discards it). For each kernel and tool,
one child process runs every named case the kernel supports (dense, paged and sparse), laid out
for it, under `compute-sanitizer --tool <tool>` with PyTorch's caching allocator off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own allocation, so a read past one is a read
past an allocation). Each finding is reported with the case it happened in, the kernel and its
source line, and the command that reruns it. Findings a kernel's authors have explained (a
racecheck report of an ordering the tool does not model) are records of the known-failure
ledger, with test "sanitize:<tool>". Exits 1 on a finding no record explains; where
compute-sanitizer is missing, or refuses the device, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass

from fmha.ci import shards
from fmha.regressions.selection import command_line, parse, resolve_kernel, selected_kernels

TOOLS = ("memcheck", "synccheck", "racecheck")
OWN = ("fmha", "triton")  # the kernels sanitized without --fmha-kernel
MARK = "fmha-sanitize-case: "
FINDINGS = ("Invalid", "Race reported", "Barrier error", "Divergent", "hazard", "Uninitialized", "Misaligned")
CONSEQUENCES = ("Program hit", "Target application returned", "process didn't terminate")
# "at <function>[+0x<offset>] in <file>:<line>"; a CUDA C++ function is its demangled signature, spaces and all
_LOCATION = re.compile(r"at (?P<where>\S.*?)(?:\+0x[0-9a-f]+)? in (?P<file>[^\s:]+):(?P<line>\d+)")
_SOURCE_LINE = re.compile(r" in (?P<file>[^\s:]+):(?P<line>\d+)")
_DIRECTORY = re.compile(r"(?<= in )\S*/(?=[^/\s]+:\d+)")


@dataclass
class Finding:
    kernel: str
    tool: str
    case: str  # the named case it happened in ("" before the first)
    what: str  # the tool's first line for it
    where: str  # the GPU kernel and its source line, where the tool says
    known: str = ""  # the ledger record's reason, if one explains it
    rerun: str = ""

    @property
    def lines(self) -> str:
        """The source lines involved, "file:line <-> file:line" for a race (first access, then
        the other), what a ledger record's `case` names."""
        named = [f"{os.path.basename(m['file'])}:{m['line']}" for m in _SOURCE_LINE.finditer(self.what)]
        other = self.where.rpartition(" at ")[2]
        if len(named) >= 2:  # both accesses on the report's line (a CUDA C++ kernel's)
            return f"{named[0]} <-> {named[1]}"
        return f"{named[0]} <-> {other}" if named else other


def run_cases(kernel_spec: str, device: str, shard: shards.Shard = shards.WHOLE) -> None:
    """The child: each case (of `shard`'s part) once, a marker line before it (the sanitizer's
    reports follow it)."""
    import torch

    from fmha.regressions.selection import resolve_kernel
    from fmha.regressions.traps import laid_out_cases

    kernel = resolve_kernel(kernel_spec)
    for trap_id, case in shard.take(laid_out_cases(kernel, device)):
        print(f"{MARK}{trap_id}/{case.id}", flush=True)
        x = case.inputs(device)
        try:
            kernel(x.q, x.k, x.v, **x.kwargs())
        except Exception as e:  # noqa: BLE001 -- a refusal or an error is judged by the suite; reads are judged here
            print(f"fmha-sanitize-raised: {type(e).__name__}: {e}", flush=True)
        if device == "cuda":
            torch.cuda.synchronize()


def parse_report(text: str, kernel: str, tool: str) -> list[Finding]:
    """compute-sanitizer's reports ("========= " lines) as findings, each in the case whose
    marker came before it."""
    findings, case = [], ""
    for line in text.splitlines():
        if line.startswith(MARK):
            case = line[len(MARK):].strip()
            continue
        if not line.startswith("========= ") or "SUMMARY" in line:
            continue
        body = line[len("========= "):]
        if not body.startswith(" ") and body.strip():
            # The tool's own findings; the errors of the API calls after an invalid access
            # ("Program hit cudaErrorLaunchFailure ...") are its consequences, not findings.
            if any(word in body for word in FINDINGS) and not any(word in body for word in CONSEQUENCES):
                findings.append(Finding(kernel, tool, case, _DIRECTORY.sub("", body.strip()), ""))
        elif findings and not findings[-1].where and (located := _LOCATION.search(body)):
            findings[-1].where = f"{located['where']} at {os.path.basename(located['file'])}:{located['line']}"
        elif findings and body.strip().startswith("and ") and not findings[-1].what.endswith("]"):
            # A race's other access that the location pattern above does not read (a kernel built
            # without line info: its offset is all there is to name it)
            findings[-1].what += f" {_DIRECTORY.sub('', body.strip())}"
    return findings


def sanitizer(device: str) -> tuple[str | None, str]:
    """(path of compute-sanitizer, "") or (None, why it cannot run here)."""
    if device != "cuda":
        return None, "compute-sanitizer checks GPU kernels: run it on a CUDA device (on the CPU, guard pages: regressions/test_reads.py)"
    path = shutil.which("compute-sanitizer") or shutil.which("compute-sanitizer", path="/usr/local/cuda/bin")
    return (path, "") if path else (None, "compute-sanitizer is not on PATH (it ships with the CUDA toolkit)")


def sanitize(kernel, tool: str, device: str, path: str, known,
             shard: shards.Shard = shards.WHOLE) -> tuple[list[Finding], str]:
    """One sanitized child over every case (of `shard`'s part): (findings, a reason the tool
    could not run, or "")."""
    from fmha.regressions import ledger

    child = [sys.executable, "-m", "fmha.ci.sanitize", "--child", kernel.name, "--fmha-device", device,
             "--shard", str(shard)]
    # Every report, not the tool's default first 100: an unexplained one past them would go unseen.
    command = [path, "--tool", tool, "--print-limit", "100000", *child]
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    text = result.stdout + result.stderr
    if MARK not in text and result.returncode:
        return [], f"compute-sanitizer did not run the cases (exit code {result.returncode}): {text.strip()[-300:]}"
    findings = parse_report(text, kernel.name, tool)
    for finding in findings:
        record = ledger.known_failure(known, kernel.name, f"sanitize:{tool}", device, finding.lines)
        finding.known = record.reason if record else ""
        finding.rerun = shlex.join(["env", "PYTORCH_NO_CUDA_MEMORY_CACHING=1", *command])
    return findings, ""


def main(argv=None) -> int:
    from fmha.regressions import ledger

    parser = command_line(__doc__, default_kernels="fmha and triton, fmha's own")
    parser.add_argument("--tool", action="append", choices=TOOLS, default=[],
                        help="compute-sanitizer tools to run (default: memcheck and synccheck)")
    parser.add_argument("--json", metavar="PATH", help="write every finding as JSON")
    parser.add_argument("--child", metavar="KERNEL", help=argparse.SUPPRESS)  # the sanitized process
    shards.add_option(parser, "the named cases")
    args = parse(parser, argv)
    if args.child:
        run_cases(args.child, args.fmha_device, args.shard)
        return 0
    # Without --fmha-kernel: fmha's own, each case on the kernel fmha.attention picks for it,
    # then on the Triton kernels also where a Gluon one would run.
    kernels = selected_kernels(parser, args) if args.fmha_kernel else [resolve_kernel(n) for n in OWN]
    path, why = sanitizer(args.fmha_device)
    if path is None:
        print(f"fmha.ci.sanitize: skipped: {why}")
        return 0
    findings, skipped = [], []
    for kernel in kernels:
        for tool in args.tool or ("memcheck", "synccheck"):
            found, refused = sanitize(kernel, tool, args.fmha_device, path, ledger.LEDGER, args.shard)
            if refused:
                skipped.append(f"{kernel.name}, {tool}: {refused}")
            findings += found
            new = [f for f in found if not f.known]
            print(f"{kernel.name}, {tool}: {'skipped' if refused else f'{len(found)} finding(s), {len(new)} unexplained'}",
                  flush=True)
    for finding in (f for f in findings if not f.known):
        print(f"\nFINDING: {finding.kernel}, {finding.tool}, case {finding.case or '(before the first case)'}\n"
              f"  {finding.what}\n  in {finding.where or '(no source line: compile the kernel with line info)'}\n"
              f"  rerun: {finding.rerun}")
    explained = collections.Counter((f.kernel, f.tool, f.lines, f.known) for f in findings if f.known)
    for (kernel, tool, lines, reason), count in explained.items():
        print(f"\nknown ({count}x): {kernel}, {tool}, {lines}: {reason}")
    for line in skipped:
        print(f"skipped: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(findings=[asdict(f) for f in findings], skipped=skipped), f, indent=1)
    return 1 if any(not f.known for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
