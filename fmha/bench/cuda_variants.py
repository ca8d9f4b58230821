"""fmha's CUDA sparse-decode kernel from several sources, timed side by side (GPU): the kernel as
it is, the same file at git revisions, and edited copies (the kernel with one part taken out,
say), each built as an extension of its own, all builds at once, then timed like `python -m
fmha.bench --sparse` (CUDA graphs, median) on its shapes, with FlashMLA's column where
`flash_mla` is importable. A variant whose output differs from the first column's is marked:
its time is a timing only.

    python -m fmha.bench.cuda_variants                                  # the kernel as it is
    python -m fmha.bench.cuda_variants --rev HEAD~1 --source nomma=/tmp/nomma.cu --shapes B64

An edited copy keeps `#include "wgmma.cuh"` working from anywhere (the kernel's folder is on
the include path); a revision is built with its own header.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile


def revision_source(rev: str, directory: str) -> str:
    """The kernel (and its header) at git revision `rev` of the checkout the package runs from,
    written into `directory`; its path."""
    from fmha.kernels import cuda_sparse

    os.makedirs(directory, exist_ok=True)
    for name in ("sparse_decode.cu", "wgmma.cuh"):
        shown = subprocess.run(["git", "show", f"{rev}:./{name}"], cwd=cuda_sparse.SOURCE_DIR,
                               capture_output=True, text=True)
        if shown.returncode:
            raise SystemExit(f"--rev {rev}: git show {name} failed: {shown.stderr.strip()}")
        with open(os.path.join(directory, name), "w") as f:
            f.write(shown.stdout)
    return os.path.join(directory, "sparse_decode.cu")


def variants(revs: list[str], sources: list[str], with_kernel: bool) -> dict[str, str]:
    """Column name -> source path: the kernel as it is (unless left out), each revision, each
    NAME=PATH."""
    from fmha.kernels import cuda_sparse

    found = {"kernel": cuda_sparse.SOURCE} if with_kernel else {}
    for rev in revs:
        found[rev] = revision_source(rev, os.path.join(tempfile.gettempdir(), f"fmha-variant-{cuda_sparse.slug(rev)}"))
    for named in sources:
        name, sep, path = named.partition("=")
        if not sep or not os.path.isfile(path):
            raise SystemExit(f"--source: expected NAME=PATH of a .cu file, got {named!r}")
        found[name] = os.path.abspath(path)
    return found


def _build(job: tuple[str, str]) -> str:
    from fmha.kernels import cuda_sparse

    name, path = job
    try:
        cuda_sparse.build(name, path)
        return ""
    except Exception as e:  # noqa: BLE001 -- one variant's build error is its row, the others go on
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", action="append", default=[], help="a git revision of the kernel (repeatable)")
    parser.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                        help="an edited copy of the kernel's .cu (repeatable)")
    parser.add_argument("--without-kernel", action="store_true", help="leave out the kernel as it is")
    parser.add_argument("--shapes", action="append", default=[], help="only the bench shapes whose name has this")
    args = parser.parse_args(argv)
    from fmha.kernels import cuda_sparse

    if cuda_sparse.availability("cuda"):
        print(f"fmha.bench.cuda_variants: {cuda_sparse.availability('cuda')}", file=sys.stderr)
        return 2
    columns = variants(args.rev, args.source, not args.without_kernel)
    jobs = [(cuda_sparse.variant_name(name, path), path) for name, path in columns.items()]
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:  # nvcc takes a minute a build
        errors = pool.map(_build, jobs)
    built = {}
    for name, (extension, path), error in zip(columns, jobs, errors):
        if error:
            print(f"{name}: build failed: {error}", file=sys.stderr)
        else:  # built: this loads torch's cached build
            built[name] = cuda_sparse.build(extension, path)
    if not built:
        return 1
    _table(built, args.shapes)
    return 0


def _table(built: dict, shape_filter: list[str]) -> None:
    """One row per bench shape: each built variant's time, then the peers'."""
    import torch

    from fmha.bench import sparse
    from fmha.bench.dense import time_us
    from fmha.kernels import cuda_sparse

    try:
        import flash_mla  # noqa: F401 -- its column, where it is installed
        peers = {"FlashMLA": sparse._flashmla}
    except ImportError:
        peers = {}
    print(f"# fmha.bench.cuda_variants, {torch.cuda.get_device_name()}, torch {torch.__version__}; µs, CUDA graphs, "
          "median; (differs): the output is not the first column's")
    print("| shape | " + " | ".join([*built, *peers]) + " |")
    print("|---" * (1 + len(built) + len(peers)) + "|")
    for shape, p in sparse.SHAPES.items():
        if shape_filter and not any(f in shape for f in shape_filter):
            continue
        x = sparse.inputs(p)
        cells, first = [], None
        for module in built.values():
            o = torch.empty(p.batch, p.q_len, p.heads_q, p.head_dim_v, dtype=torch.bfloat16, device="cuda")

            def run(module=module, o=o, x=x):
                return cuda_sparse.attend(p, x["q"], x["k_cache"], x["k_cache"], sink=x["sink"], out=o,
                                          indices=x["indices"], extra_k_cache=x["extra_k_cache"],
                                          extra_indices=x["extra_indices"], extension=lambda: module)
            run()
            torch.cuda.synchronize()
            first = o.clone() if first is None else first
            same = torch.equal(o, first)
            cells.append(f"{time_us(run):.1f}" + ("" if same else " (differs)"))
        cells += [f"{time_us(make(p, x)):.1f}" for make in peers.values()]
        print(f"| {shape} | " + " | ".join(cells) + " |", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
