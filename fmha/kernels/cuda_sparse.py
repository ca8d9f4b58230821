"""DeepSeek-V4's sparse decode on Hopper in CUDA C++ (fmha/kernels/cuda/sparse_decode.cu): each
query row's keys by index over one or two quantized caches (dsv4-fp8, dsv4-fp4), K = V of head
dim 512, a sink, in bf16.

What Gluon cannot express and this kernel does: a CTA cluster's distributed shared memory.
- A CTA owns 64 query heads of one (request, query row); Hq > 64 runs as a 2-CTA cluster. Per
  64-key tile each CTA gathers and dequantizes 32 keys into its own shared memory, and the bulk
  copy engine copies them into its peer's (`cp.async.bulk.shared::cluster`, completing bytes on
  the peer's mbarrier), chunks 0-3 (dims 0-255) while chunks 4-7 are dequantized; a stage is
  free once both consumer warpgroups of both CTAs arrive on it (remote arrives). So a key is
  read and dequantized once for 128 heads (fmha.kernels.gluon_sparse: once per 64).
- Two passes, the second rare: keys, q and P in f16 first, so that P.V is one wgmma chain at the
  gate's precision (P's 11 bits; P rounded to bf16 alone is FlashMLA's 0.9999979). f16 holds
  every dequantized key element exactly for e4m3 scale codes 112-134 and e2m1 104-140 (checked
  a key at a time), q scaled by a power of two to its range, the rope dims from 2^-17 up. A row
  with a value outside runs again in bf16, P split into bf16 hi + lo (two P.Vs).
- Dequantization without a per-code path: in the f16 pass two e4m3 codes are one
  `cvt.rn.f16x2.e4m3x2` (exact, NaN codes to NaN) and one multiply by 2^(scale - 127); in the
  bf16 pass (sm_90 has no e4m3 to bf16 conversion) a code's bits moved into a bf16's are its value
  times 2^-120, zeros and subnormals too, and one multiply by 2^(scale - 7) scales two values
  exactly (two multiplies for scales above 134; NaN codes ORed in from a byte mask). e2m1 codes
  go through 8-entry byte tables (`prmt`) and one multiply by the scale. The producer has the
  next piece's bytes in flight while it dequantizes this one.
- Warpgroup 0: QK^T (wgmma m64n64k16, q and keys from shared memory), the online softmax,
  P.V for Dv[0:256] with P from its registers; warpgroup 1: P.V for Dv[256:512] (m64n256k16,
  the key tile read as V, P from shared memory, stored by stmatrix), told P is full once
  warpgroup 0's P.V is issued; warpgroup 2: the producer. Two key stages, two
  P buffers. Both consumer warpgroups load q while the producer gathers the first tiles, and
  stage o in shared memory for the bulk copy engine to store, 512 contiguous bytes a head.

Measured (BENCHMARKS.md, "the CUDA kernel beside FlashMLA"): at the gate on all 96 sparse
configs, faster than the Gluon kernel, faster than FlashMLA on the four 1024-key bench shapes and
1.03-1.07x its time on the 512-key ones (a CTA's start and end, q in and o out, cost about 10.5 µs,
a third of the one-wave shapes).

Built once per machine into fmha.kernels.build's cache (`python -m fmha.kernels.build`: nvcc,
sm_90a, about a minute), which every process reads. fmha.attention runs it first wherever it is
built and runs fmha.kernels.gluon_sparse where it is not (a call never waits for nvcc);
`implementation="cuda"`, or the kernel `cuda-sparse`, builds it on its first call. Where it
cannot build or run, `availability` says why. Without a GPU or torch's CUDA headers the kernels
compile alone, with their register report: `python -m fmha.kernels.build --kernel-only`. A
build that fails is a NotSupportedError with its reason, and fmha.attention runs the next
kernel (fmha.kernels.gluon_sparse).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from pathlib import Path

import torch

from fmha.contract import NotSupportedError, implemented_by
from fmha.kernels import build as builds
from fmha.kernels import gluon_sparse

SOURCE_DIR = os.path.join(os.path.dirname(__file__), "cuda")
SOURCE = os.path.join(SOURCE_DIR, "sparse_decode.cu")
# -lineinfo: compute-sanitizer and ncu name source lines (no cost in the code it generates)
NVCC_FLAGS = ("-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-DNDEBUG", "-lineinfo")
LAYOUT_CODES = {"dsv4-fp8": 1, "dsv4-fp4": 2}


_BUILD_FAILURE: list[str] = []  # why this process's build failed, once it has


def slug(text: str) -> str:
    """`text` with every character but letters and digits made "_": a name for a file or a build."""
    return "".join(c if c.isalnum() else "_" for c in text)


def extension_name(kind: str, name: str, source_text: str) -> str:
    """The extension name of a build of `source_text` (this kernel's .cu, patched or edited)
    called `name` of `kind` ("mutant", "variant"): the name carries a digest of the content, so
    that one process never takes one build for another."""
    return f"fmha_{kind}_{slug(name)}_{hashlib.sha1(source_text.encode()).hexdigest()[:12]}"


def variant_name(name: str, path: str) -> str:
    """The extension name of the edited copy of this kernel at `path`, called `name`."""
    with open(path) as f:
        return extension_name("variant", name, f.read())


def kernel_build(name: str = "fmha_cuda_sparse", source_text: str | None = None) -> builds.Build:
    """This kernel's build (fmha.kernels.build), or that of `source_text` (a patched or edited
    copy of its .cu) as the extension `name`, with the headers beside it."""
    if source_text is None:
        with open(SOURCE) as f:
            source_text = f.read()
    headers = tuple((path.name, path.read_text()) for path in sorted(Path(SOURCE_DIR).glob("*.cuh")))
    return builds.Build(name, source_text, headers, NVCC_FLAGS, file_name=os.path.basename(SOURCE))


def cuda_builds() -> list[builds.Build]:
    """For `python -m fmha.kernels.build` (the `fmha.cuda_builds` entry point "kernels")."""
    return [kernel_build()]


def build(name: str, source: str = SOURCE):
    """`source` (this kernel's .cu, or a patched copy of it) built as the extension `name`,
    through the build cache."""
    with open(source) as f:
        return builds.load(kernel_build(name, f.read()))


@functools.cache
def module():
    """The built extension: from the build cache (`python -m fmha.kernels.build` fills it once
    per machine), else built into it now, about a minute on 16 cores. Built on the first call
    that runs the kernel, not when a dispatch asks whether it could."""
    try:
        return builds.load(kernel_build())
    except Exception as e:  # say why; fmha.attention runs the next kernel (the Gluon one) from now on
        _BUILD_FAILURE.append(f"its build failed ({type(e).__name__}: {str(e).strip().splitlines()[-1][:300]})")
        raise NotSupportedError(f"cuda-sparse: {_BUILD_FAILURE[0]}") from e


@functools.cache
def _own_entry() -> Path | None:
    """This kernel's directory in the build cache (None without nvcc): its sources read and
    hashed once a process, not at every dispatch."""
    toolchain = builds.toolchain()
    return None if toolchain is None else builds.entry(kernel_build(), toolchain)


def built() -> bool:
    """Whether this kernel is in the build cache for this machine's toolchain."""
    entry = _own_entry()
    return entry is not None and (entry / builds.DONE).exists()


def availability(device) -> str | None:
    """Why the CUDA kernel cannot run on `device` at all, or None."""
    if _BUILD_FAILURE:
        return _BUILD_FAILURE[0]
    return _device_availability(device)


@functools.cache
def _device_availability(device) -> str | None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"needs a Hopper GPU (sm_90a: wgmma, clusters), this one is sm_{major}{minor}"
    if builds.nvcc() is None:
        return "no nvcc to build it with (set CUDA_HOME or put nvcc on PATH)"
    return None


# gluon_sparse's call, over the quantized layouts only.
CAPABILITIES = dataclasses.replace(
    gluon_sparse.CAPABILITIES, cache_layouts=frozenset(LAYOUT_CODES), unquantized_caches=False,
    notes={**gluon_sparse.CAPABILITIES.notes, "device": "a Hopper GPU (sm_90a) and nvcc to build it",
           "cache_layout": "the quantized DSV4 layouts; bf16 caches run fmha.kernels.gluon_sparse"})


def _aligned(t: torch.Tensor, elements: int, alignment: int) -> bool:
    """Whether the kernel's vector accesses fit `t`: the head dim contiguous, the other strides a
    multiple of `elements` and the base `alignment`-byte aligned (else it reads or writes a copy)."""
    return (t.stride(-1) == 1 and all(s % elements == 0 for s in t.stride()[:-1])
            and t.data_ptr() % alignment == 0)


def attend(problem, q, k, v, *, scale=None, sink=None, out=None, indices, topk_len=None, extra_k_cache=None,
           extra_indices=None, extra_topk_len=None, extension=module):
    """`problem` (a checked index-sparse call over quantized caches, K = V, that the capabilities
    cover) in one launch of `extension()`'s kernel: (o (B, T, Hq, 512) in q's dtype, lse (B, Hq, T)
    float32)."""
    B, T, HQ, _ = q.shape
    o = out if out is not None and _aligned(out, 8, 16) else torch.empty(B, T, HQ, 512, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, HQ, T, dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    two = extra_k_cache is not None
    extension().sparse_decode(
        q if _aligned(q, 8, 16) else q.contiguous(), o, lse, sink, k, indices, topk_len,
        LAYOUT_CODES[problem.cache_layout], extra_k_cache if two else None, extra_indices if two else None,
        extra_topk_len if two else None, LAYOUT_CODES[problem.extra_cache_layout] if two else 0,
        problem.head_dim**-0.5 if scale is None else float(scale), None)
    if out is not None and o is not out:
        out.copy_(o)
        o = out
    return o, lse


ENTRY = implemented_by("cuda-sparse", attend, CAPABILITIES, availability=availability, default_devices=("cuda",),
                       description="fmha's CUDA C++ sparse-decode kernel alone (DSV4: index-sparse bf16 head dim 512 "
                                   "K = V over FP8 or FP4 caches, sm_90a, a 2-CTA cluster sharing each dequantized "
                                   "key tile; fmha.attention runs it first on Hopper where it is built)")


def _built_availability(device) -> str | None:
    return availability(device) or (None if built() else
                                     "not built on this machine: python -m fmha.kernels.build (fmha.attention does "
                                     "not make a call wait a minute for nvcc; implementation='cuda' builds it)")


# fmha.attention's view of it: first where it is built, skipped where it is not.
BUILT = dataclasses.replace(ENTRY, availability=_built_availability)
