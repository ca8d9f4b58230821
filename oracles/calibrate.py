"""Measure correct kernels' metrics to set the verdict's thresholds (oracles/verdict.py).

    python -m oracles.calibrate [--kernel NAME ...] [--seeds 4] [--device cpu|cuda]

Runs every feature case x dtype x input distribution x seed on each kernel it supports and
prints, per (kernel, dtype), the worst value of each gated metric and the tolerance it
would pass under, as a Markdown table for oracles/CALIBRATION.md.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from collections import defaultdict

import torch

from fmha import registry
from fmha.problem import DTYPE_NAMES
from oracles.check import judge_run, run_kernel
from oracles.inputs import DISTRIBUTIONS, make_inputs
from oracles.verdict import TOLERANCES
from properties.feature_cases import FEATURE_CASES, with_dtypes

# Gated metric -> (worse-is-larger value extractor, column title)
COLUMNS = {
    "1-cos": lambda m: 1 - m.cos,
    "1-worst row cos": lambda m: 1 - m.worst_row_cos,
    "error ratio": lambda m: m.error_ratio,
    "worst row err": lambda m: m.worst_row_err,
    "ulp / conditioning": lambda m: m.max_ulp * m.output_floor / m.floor,
    "lse err": lambda m: m.lse_max_err if m.lse_max_err is not None else -math.inf,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", action="append", default=[])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    kernels = [registry.resolve_kernel(k) for k in args.kernel] or registry.default_kernels(args.device)

    worst: dict = defaultdict(lambda: {c: (-math.inf, "") for c in COLUMNS})
    runs: dict = defaultdict(int)
    failures = []
    for kernel in kernels:
        for problem in with_dtypes(FEATURE_CASES):
            if kernel.not_supported_reasons(problem, args.device):
                continue
            for distribution in DISTRIBUTIONS:
                for seed in range(args.seeds):
                    inputs = make_inputs(problem, distribution, seed, args.device)
                    verdict = judge_run(run_kernel(kernel, problem, inputs))
                    key = (kernel.name, problem.dtype)
                    runs[key] += 1
                    where = f"{problem.id} {distribution} seed {seed}"
                    if not verdict.passed:
                        failures.append(verdict.message(f"{kernel.name} {where}"))
                    for column, value in COLUMNS.items():
                        v = value(verdict.metrics)
                        if v > worst[key][column][0]:
                            worst[key][column] = (v, where)

    print(f"Calibration, {datetime.date.today()}, device {args.device}"
          f" ({torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}), torch {torch.__version__}, "
          f"{args.seeds} seeds x {len(DISTRIBUTIONS)} distributions x feature cases\n")
    print("| kernel | dtype | runs | " + " | ".join(COLUMNS) + " |")
    print("|---" * (3 + len(COLUMNS)) + "|")
    for (name, dtype), row in worst.items():
        cells = " | ".join(f"{v:.3g}" for v, _ in row.values())
        print(f"| {name} | {DTYPE_NAMES[dtype]} | {runs[(name, dtype)]} | {cells} |")
    print("\nWorst cases:")
    for (name, dtype), row in worst.items():
        for column, (v, where) in row.items():
            print(f"  {name} {DTYPE_NAMES[dtype]} {column}: {v:.3g} ({where})")
    print(f"\nCurrent tolerances: { {DTYPE_NAMES[d]: t for d, t in TOLERANCES.items()} }")
    print(f"{len(failures)} run(s) fail the current tolerances")
    for f in failures[:20]:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
