"""Verify kernels against the float64 oracle from the command line: the README's main job.

    python -m ci.verify                                  # registry defaults for this device
    python -m ci.verify --fmha-kernel sdpa-math --fmha-kernel my_pkg.attn:fwd
    python -m ci.verify --calibrate --seeds 4            # worst metric values, for the tolerances

Runs every feature case x dtype x input distribution x seed that each kernel supports,
prints one line per (kernel, dtype) and every failing verdict, and exits 1 if any failed.
With --calibrate it prints the worst value of each gated metric instead (the table in
oracles/CALIBRATION.md).
"""

from __future__ import annotations

import datetime
import math
import sys
from collections import defaultdict

import torch

from ci.cli import kernel_parser, selected_kernels
from fmha.problem import DTYPE_NAMES
from oracles.check import judge_run, run_kernel
from oracles.inputs import DISTRIBUTIONS, make_inputs
from properties.feature_cases import FEATURE_CASES, with_dtypes

# Gated metric -> worse-is-larger value.
WORST = {
    "1-cos": lambda m: 1 - m.cos,
    "1-worst row cos": lambda m: 1 - m.worst_row_cos,
    "error ratio": lambda m: m.error_ratio,
    "worst row err": lambda m: m.worst_row_err,
    "ulp / conditioning": lambda m: m.max_ulp * m.output_floor / m.floor,
    "lse err": lambda m: m.lse_max_err if m.lse_max_err is not None else -math.inf,
}


def main(argv=None) -> int:
    parser = kernel_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--calibrate", action="store_true", help="print the worst value of each gated metric")
    args = parser.parse_args(argv)
    kernels = selected_kernels(parser, args)

    worst: dict = defaultdict(lambda: {c: (-math.inf, "") for c in WORST})
    counts: dict = defaultdict(lambda: defaultdict(int))
    failures = []
    for kernel in kernels:
        for problem in with_dtypes(FEATURE_CASES):
            key = (kernel.name, problem.dtype)
            if kernel.not_supported_reasons(problem, args.device):
                counts[key]["skipped"] += len(DISTRIBUTIONS) * args.seeds
                continue
            for distribution in DISTRIBUTIONS:
                for seed in range(args.seeds):
                    inputs = make_inputs(problem, distribution, seed, args.device)
                    verdict = judge_run(run_kernel(kernel, problem, inputs))
                    where = f"{problem.id} {distribution} seed {seed}"
                    counts[key]["passed" if verdict.passed else "failed"] += 1
                    if not verdict.passed:
                        failures.append(verdict.message(f"{kernel.name} {where}"))
                    for column, value in WORST.items():
                        v = value(verdict.metrics)
                        if v > worst[key][column][0]:
                            worst[key][column] = (v, where)

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"# fmha verify, {datetime.date.today()}, {device_name}, torch {torch.__version__}, "
          f"{len(FEATURE_CASES)} feature cases x {len(DISTRIBUTIONS)} distributions x {args.seeds} seed(s)\n")
    if args.calibrate:
        print("| kernel | dtype | runs | " + " | ".join(WORST) + " |")
        print("|---" * (3 + len(WORST)) + "|")
        for (name, dtype), row in worst.items():
            cells = " | ".join(f"{v:.3g}" if v > -math.inf else "—" for v, _ in row.values())
            print(f"| {name} | {DTYPE_NAMES[dtype]} | {counts[(name, dtype)]['passed'] + counts[(name, dtype)]['failed']} | {cells} |")
        print("\nWhere each worst value came from:")
        for (name, dtype), row in worst.items():
            for column, (v, where) in row.items():
                print(f"  {name} {DTYPE_NAMES[dtype]} {column}: {v:.3g} ({where})")
    else:
        print("| kernel | dtype | passed | failed | skipped (unsupported) |")
        print("|---|---|---|---|---|")
        for (name, dtype), c in counts.items():
            print(f"| {name} | {DTYPE_NAMES[dtype]} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    if failures:
        print(f"\n{len(failures)} failing verdict(s):")
        for f in failures:
            print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
