"""Compile fmha's attention kernels for Hopper (sm_90) on any machine, no GPU needed, and report
what the tile table costs: shared memory, registers, stack (spills). Head dim 512 in bf16 also
compiles the Gluon kernel that runs it on Hopper (fmha.kernels.gluon_dense); `--sources` compiles
contract v2's kernels (fmha.kernels.triton_paged for its DSV4 sparse decode and a ragged paged prefill,
fmha.kernels.gluon_sparse for the sparse decode, and where nvcc is installed fmha.kernels.cuda_sparse,
its CUDA C++ kernel compiled alone: a build error or a spill fails).

    TRITON_INTERPRET=0 python -m fmha.kernels.compile_check [HEAD_DIM ...] [--dtype bf16|fp16|fp32 ...] [--sources]

Triton's bundled ptxas does the work, so a tile that would not fit a real H100/H200 (shared
memory above the 227 KiB a block may use) fails here, on a laptop or a CPU CI runner, instead
of on the GPU runner. Exits 1 if any configuration does not compile or does not fit.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Importing the fmha package already chose between compiling and interpreting (fmha/__init__.py
# picks the interpreter on a machine without CUDA unless told otherwise).
if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("fmha.kernels.compile_check compiles for the GPU: run it with TRITON_INTERPRET=0")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fmha.kernels import gluon_dense, gluon_sparse, triton_dense, triton_paged
from fmha.contract import Problem

HOPPER = GPUTarget("cuda", 90, 64)
SHARED_MEMORY_LIMIT = 232448  # bytes a block may use on sm_90 (what Triton reports as the hardware limit)
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def compile_attention(problem: Problem) -> tuple[dict, int, int, int]:
    """(tiles, shared memory bytes, registers per thread, stack bytes per thread) of the kernel
    the host code would launch for `problem` on a GPU."""
    tiles = triton_dense._tiles(problem, "cuda", k_is_v=problem.shared_kv)
    ty = TRITON_TYPES[problem.dtype]
    types = dict(
        Q=f"*{ty}", SINK=f"*{ty}", O=f"*{ty}", LSE="*fp32", qk_scale="fp32",
        K=f"tensordesc<{ty}[1,{tiles['BLOCK_N']},1,{tiles['BLOCK_D']}]>",
        V=f"tensordesc<{ty}[1,{tiles['BLOCK_N']},1,{tiles['BLOCK_DV']}]>",
    )
    constants = triton_dense._specialization(problem, tiles, upcast=False)
    options = {k: constants.pop(k) for k in ("num_warps", "num_stages")}
    return tiles, *_compile(ASTSource, triton_dense._attention_fwd, types, constants, options)


def compile_gluon(problem: Problem) -> tuple[int, int, int]:
    """(shared memory bytes, registers per thread, stack bytes per thread) of the Gluon kernel
    for `problem` (bf16, head dim 512), with every mask and the sink compiled in."""
    from triton.experimental.gluon._runtime import GluonASTSource

    block = [1, gluon_dense.BLOCK_N.value, 1, gluon_dense.CHUNK.value]
    descriptor = f"tensordesc<bf16[{','.join(map(str, block))}],{gluon_dense.key_layout()!r}>"
    types = dict(Q="*bf16", SINK="*bf16", O="*bf16", LSE="*fp32", qk_scale="fp32", k_desc=descriptor,
                 v_desc=descriptor)
    constants = gluon_dense.specialization(causal=True, windowed=True, sink=True, split=False,
                                               k_is_v=problem.shared_kv)
    return _compile(GluonASTSource, gluon_dense._attention_fwd, types, constants, {"num_warps": 4})


# Contract v2's shapes: DSV4 sparse decode (FP8 window cache, FP4 compressed cache, sink) and
# a causal ragged paged prefill.
SOURCE_PROBLEMS = {
    "DSV4 sparse decode, FP8 + FP4 scopes": Problem(
        batch=64, q_len=1, kv_len=128, heads_q=128, heads_kv=1, head_dim=512, shared_kv=True, sink=True,
        source="sparse", block_size=64, cache_layout="dsv4-fp8", extra_topk=512, extra_block_size=64,
        extra_cache_layout="dsv4-fp4"),
    "ragged paged prefill, D=128 bf16": Problem(
        batch=4, q_len=16, kv_len=1000, heads_q=8, heads_kv=2, head_dim=128, causal=True, source="paged",
        block_size=16, ragged=True),
}


def compile_sources(problem: Problem) -> tuple[dict, int, int, int]:
    """(tiles, shared memory bytes, registers per thread, stack bytes per thread) of the v2
    kernel the host code would launch for `problem` on a GPU."""
    tiles = triton_paged._tiles(problem, "cuda")
    ty = TRITON_TYPES[problem.dtype]
    cache = lambda layout: "*u8" if layout else f"*{ty}"  # noqa: E731
    types = dict(Q=f"*{ty}", K=cache(problem.cache_layout), V=cache(problem.cache_layout),
                 K2=cache(problem.extra_cache_layout or problem.cache_layout), SINK="*fp32", O=f"*{ty}",
                 LSE="*fp32", qk_scale="fp32", q_unit="fp32",
                 **{name: "*i32" for name in ("BT", "KV_LENS", "CU_Q", "IDX", "TOPK_LEN", "IDX2", "TOPK_LEN2")})
    constants = triton_paged.specialization(problem, tiles, upcast=False)
    options = {k: constants.pop(k) for k in ("num_warps", "num_stages")}
    return tiles, *_compile(ASTSource, triton_paged._sources_fwd, types, constants, options)


def compile_gluon_sparse(problem: Problem) -> tuple[int, int, int]:
    """(shared memory bytes, registers per thread, stack bytes per thread) of the Gluon
    sparse-decode kernel for `problem` as a launch on contiguous tensors compiles it: pointers
    and the specialized strides 16-divisible (its FP8 loads are 16-byte vectors then)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    cache = lambda layout: "*u8" if layout else "*bf16"  # noqa: E731
    types = dict(Q="*bf16", K1=cache(problem.cache_layout),
                 K2=cache(problem.extra_cache_layout or problem.cache_layout), SINK="*fp32", O="*bf16", LSE="*fp32",
                 qk_scale="fp32", q_unit="fp32",
                 **{name: "*i32" for name in ("IDX1", "IDX2", "TOPK_LEN1", "TOPK_LEN2")})
    aligned = [name for name in gluon_sparse._sparse_fwd.arg_names
               if name in types and name not in ("qk_scale", "q_unit")
               or name.startswith(("stride_q", "stride_o", "stride_k"))]
    return _compile(GluonASTSource, gluon_sparse._sparse_fwd, types, gluon_sparse.specialization(problem),
                    {"num_warps": 4}, aligned)


def compile_cuda_sparse(source: str | None = None) -> list[tuple[str, int, int]]:
    """(instance, registers per thread, spilled bytes) of each instance of the CUDA sparse-decode
    kernel (a lone CTA, a 2-CTA cluster) that nvcc builds from `source` (its .cu by default)
    alone, without torch's headers; a build error is a CalledProcessError with nvcc's output.
    Its shared memory is checked by the source itself (a static_assert)."""
    from fmha.kernels import build, cuda_sparse

    with open(source or cuda_sparse.SOURCE) as f:
        kernel = build.kernel_only(cuda_sparse.kernel_build(source_text=f.read()))
    with tempfile.TemporaryDirectory() as out:  # the command `python -m fmha.kernels.build --kernel-only` runs
        build.compile_kernel_only(kernel, Path(out))
        report = (Path(out) / "ptxas.txt").read_text()
    instances = []
    for entry in re.split(r"Compiling entry function", report)[1:]:
        cluster = re.search(r"sparse_decode_kernelILi(\d)E", entry).group(1)
        spills = sum(map(int, re.findall(r"(\d+) bytes spill (?:stores|loads)", entry)))
        registers = int(re.search(r"Used (\d+) registers", entry).group(1))
        instances.append(("a lone CTA" if cluster == "1" else "a 2-CTA cluster", registers, spills))
    return instances


def _compile(source_type, kernel, types: dict, constants: dict, options: dict, aligned=()) -> tuple[int, int, int]:
    """Compile `kernel` for sm_90 (arguments not in `types` are i32, `constants` constexpr,
    those in `aligned` divisible by 16); return (shared memory bytes, registers per thread,
    stack bytes per thread)."""
    signature = {name: "i32" for name in kernel.arg_names}
    signature.update(types)
    signature.update({name: "constexpr" for name in constants})
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = source_type(kernel, signature, {(kernel.arg_names.index(k),): v for k, v in constants.items()}, attrs)
    compiled = triton.compile(source, target=HOPPER, options=options)
    return compiled.metadata.shared, *_resource_usage(compiled.asm["cubin"])


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True,
                                check=True).stdout
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", report)
    return int(found.group(1)), int(found.group(2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head_dims", type=int, nargs="*", default=[64, 80, 128, 192, 256, 384, 512])
    parser.add_argument("--dtype", action="append", choices=sorted(TRITON_TYPES.values()), default=[])
    parser.add_argument("--sources", action="store_true", help="also contract v2's kernel (fmha.kernels.triton_paged)")
    args = parser.parse_args(argv)
    dtypes = [t for t, name in TRITON_TYPES.items() if not args.dtype or name in args.dtype]
    failures = 0
    for head_dim, dtype, shared_kv in itertools.product(args.head_dims, dtypes, (False, True)):
        # Many heads on one KV head (DSV4 decode): the table's full-size tiles.
        problem = Problem(batch=1, q_len=1, kv_len=640, heads_q=128, heads_kv=1, head_dim=head_dim, dtype=dtype, shared_kv=shared_kv)
        what = f"D={head_dim} {TRITON_TYPES[dtype]} {'K is V' if shared_kv else 'K, V'}"
        try:
            tiles, shared, registers, stack = compile_attention(problem)
            shape = tuple(tiles[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "num_warps", "num_stages"))
            failures += _report(f"{what}: tiles {shape}{' V from the key tile' if tiles['V_FROM_K'] else ''}",
                                shared, registers, stack)
            if head_dim == gluon_dense.HEAD_DIM and dtype == torch.bfloat16:
                what = f"{what}, Gluon"
                failures += _report(what, *compile_gluon(problem))
        except Exception as e:  # noqa: BLE001 -- a compiler error is a finding, reported like the others
            failures += 1
            print(f"{what}: does not compile: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
    for what, problem in SOURCE_PROBLEMS.items() if args.sources else ():
        try:
            tiles, shared, registers, stack = compile_sources(problem)
            shape = tuple(tiles[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "num_warps"))
            failures += _report(f"v2 {what}: tiles {shape}", shared, registers, stack)
            if not gluon_sparse.CAPABILITIES.not_supported_reasons(problem, "cuda"):
                failures += _report(f"v2 {what}, Gluon", *compile_gluon_sparse(problem))
        except Exception as e:  # noqa: BLE001 -- as above
            failures += 1
            print(f"v2 {what}: does not compile: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
    if args.sources:
        failures += _check_cuda_sparse()
    return 1 if failures else 0


def _check_cuda_sparse(source: str | None = None) -> int:
    """Print the CUDA kernel's instances; the number that do not build or spill."""
    from fmha.kernels import build

    what = "v2 DSV4 sparse decode, CUDA"
    if build.nvcc() is None:
        print(f"{what}: not compiled: no nvcc (set CUDA_HOME or put nvcc on PATH)", flush=True)
        return 0
    try:
        instances = compile_cuda_sparse(source)
    except subprocess.CalledProcessError as e:
        errors = [line for line in e.stderr.splitlines() if "error" in line] or e.stderr.splitlines()[-1:]
        print(f"{what}: does not compile: {' / '.join(errors)[:300]}", flush=True)
        return 1
    for instance, registers, spills in instances:
        print(f"{what}, {instance}: {registers} registers, spills {spills} B{' SPILLS' if spills else ''}", flush=True)
    return sum(spills > 0 for _, _, spills in instances)


def _report(what: str, shared: int, registers: int, stack: int) -> bool:
    """Print one configuration's resources; True if it does not fit."""
    fits = shared <= SHARED_MEMORY_LIMIT
    print(f"{what}, shared {shared} B{'' if fits else ' OVER THE LIMIT'}, {registers} registers, stack {stack} B",
          flush=True)
    return not fits


if __name__ == "__main__":
    sys.exit(main())
