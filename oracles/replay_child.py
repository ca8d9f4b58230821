"""A clean child process that makes a kernel's calls as a plain script would
(fmha.oracles.production's `child` context).

The child is started once per process and kernel, and reused. It gets an environment built from
an allowlist (what a kernel needs to find its builds and compilers: `FMHA_KERNEL_CACHE`,
`TRITON_*`, `CUDA_*`, the paths; none of `CI`, `PYTEST_*`, `HYPOTHESIS_*` or the run's seed),
runs as `python main.py` from an empty directory, imports torch and the kernel's own module and
nothing else, and takes the parent's torch threads and determinism flags. Each call's arguments
go to it as their storages' bytes with shape, strides and offset (two arguments sharing a
storage share it there, one tensor passed twice is one tensor there); the outputs come back the
same way and are judged in the parent.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile

import torch

from fmha.contract import KernelEntry
from fmha.oracles.kernel_call import storage_bytes

# Kernel name -> how this run was told to find it (`module:attr`, a registry name), set by the fmha
# plug-in from its selection.
SPECS: dict[str, str] = {}
ALLOWED_ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ",
                       "LD_LIBRARY_PATH", "CC", "CXX", "NVCC", "FMHA_KERNEL_CACHE", "FMHA_CPU_THREADS",
                       "OMP_NUM_THREADS", "TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "VIRTUAL_ENV")
ALLOWED_PREFIXES = ("TRITON_", "CUDA_", "NVIDIA_")
# What a kernel is configured by, named by its author (--fmha-replay-env): passed to the child too.
KERNELS_ENVIRONMENT: set[str] = set()
REPLY_TIMEOUT_S = 600

_CHILD: list = []  # this process's Child, once started
__judge_state__ = ("_CHILD", "SPECS", "KERNELS_ENVIRONMENT")  # fmha.oracles.guard: not a part of what judges

SCRIPT = r'''
import os, pickle, struct, sys
replies = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)  # what the kernel prints goes to the log, not into the replies
requests = sys.stdin.buffer


def read():
    n = struct.unpack("<Q", requests.read(8))[0]
    return pickle.loads(requests.read(n))


def write(obj):
    data = pickle.dumps(obj)
    replies.write(struct.pack("<Q", len(data)) + data)
    replies.flush()


setup = read()
import torch
torch.set_num_threads(setup["threads"])
torch.use_deterministic_algorithms(setup["deterministic"])
torch.set_float32_matmul_precision(setup["matmul_precision"])
torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = setup["tf32"]
kernels = {}


def resolved(spec):
    if spec not in kernels:
        if ":" in spec:
            import importlib
            module, _, attr = spec.partition(":")
            kernel = importlib.import_module(module)
            for part in attr.split("."):
                kernel = getattr(kernel, part)
        else:
            import fmha.registry
            kernel = fmha.registry.resolve_kernel(spec).fn
        kernels[spec] = kernel
    return kernels[spec]



def tensor(meta, storages):
    dtype = getattr(torch, meta["dtype"])
    return torch.empty(0, dtype=dtype, device=meta["device"]).set_(
        storages[meta["storage"]].untyped_storage(), meta["offset"], meta["shape"], meta["stride"])


def encoded(t, given):
    if not isinstance(t, torch.Tensor):
        return t
    key = t.untyped_storage().data_ptr()
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": tuple(t.shape), "stride": t.stride(),
            "offset": t.storage_offset(), "given": given.get(key), "bytes": raw.cpu().numpy().tobytes()}


while True:
    call = read()
    if call is None:
        break
    try:
        storages = {key: torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else
                    torch.empty(0, dtype=torch.uint8, device=device) for key, (device, data) in call["storages"].items()}
        made = {}  # an argument passed twice (v is k) is one tensor here too

        def argument(a):
            if not isinstance(a, dict):
                return a
            return made.setdefault(a["object"], tensor(a, storages))

        args = [argument(a) for a in call["args"]]
        kwargs = {k: argument(a) for k, a in call["kwargs"].items()}
        given = {s.untyped_storage().data_ptr(): key for key, s in storages.items()}
        result = resolved(call["spec"])(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        write({"result": [encoded(t, given) for t in result] if isinstance(result, (tuple, list)) else
               encoded(result, given), "modules": sorted(sys.modules)})
    except BaseException as e:
        write({"error": f"{type(e).__name__}: {e}"})
'''


def spec_of(kernel: KernelEntry) -> str | None:
    """How a child process finds `kernel`: as this run was told to (a registry name or
    `module:attr`), else by its function's import path; None for one it cannot (a mutant patched
    or made in a function)."""
    spec = SPECS.get(kernel.name)
    if spec is not None and not spec.startswith("mutant:"):
        return spec
    fn = kernel.fn
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<locals>" in qualname or getattr(fn, "__module__", None) in (None, "__main__"):
        return None
    return f"{fn.__module__}:{qualname}"


def environment() -> dict[str, str]:
    """The child's environment: the allowlist's variables, those the kernels are configured by, and
    the parent's import path."""
    env = {k: v for k, v in os.environ.items()
           if k in ALLOWED_ENVIRONMENT or k in KERNELS_ENVIRONMENT or k.startswith(ALLOWED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    return env


class Child:
    """One child process making the calls of the kernels it is asked for (each resolved on its
    first call there)."""

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="fmha-replay-")
        script = os.path.join(self.directory, "main.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        self.log_path = os.path.join(self.directory, "stderr.log")
        self.env = environment()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "main.py"], cwd=self.directory, env=self.env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self._send({"threads": torch.get_num_threads(),
                    "deterministic": torch.are_deterministic_algorithms_enabled(),
                    "matmul_precision": torch.get_float32_matmul_precision(),
                    "tf32": (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)})
        self.modules: list[str] = []  # the child's sys.modules after its last call

    def _send(self, obj) -> None:
        data = pickle.dumps(obj)
        self.process.stdin.write(struct.pack("<Q", len(data)) + data)
        self.process.stdin.flush()

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            ready, _, _ = select.select([self.process.stdout], [], [], REPLY_TIMEOUT_S)
            chunk = os.read(self.process.stdout.fileno(), left) if ready else b""
            if not chunk:
                self.close()
                with open(self.log_path, errors="replace") as log:
                    said = log.read()[-600:]
                raise AssertionError(f"the child process replaying the calls "
                                     f"{'died' if ready else f'gave no answer in {REPLY_TIMEOUT_S} s'} "
                                     f"(exit code {self.process.poll()}); its last words: {said!r}")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _receive(self):
        return pickle.loads(self._read(struct.unpack("<Q", self._read(8))[0]))

    def caller(self, spec: str):
        """A function making `spec`'s calls in the child."""
        return lambda *args, **kwargs: self.call(spec, *args, **kwargs)

    def call(self, spec: str, *args, **kwargs):
        """The call of the kernel `spec` names made in the child; its outputs as tensors here (one the child wrote
        into an argument's storage is that argument's storage here, its bytes copied back)."""
        storages, by_key = {}, {}

        def encoded(t):
            if not isinstance(t, torch.Tensor):
                return t
            key = t.untyped_storage().data_ptr()
            if key not in storages:
                raw = storage_bytes(t)
                storages[key] = (str(t.device), raw.cpu().numpy().tobytes())
                by_key[key] = raw
            return {"storage": key, "object": id(t), "dtype": str(t.dtype).removeprefix("torch."),
                    "device": str(t.device), "shape": tuple(t.shape), "stride": t.stride(), "offset": t.storage_offset()}

        self._send({"spec": spec, "args": [encoded(a) for a in args],
                    "kwargs": {k: encoded(v) for k, v in kwargs.items()}, "storages": storages})
        reply = self._receive()
        self.modules = reply.get("modules", self.modules)
        if "error" in reply:
            raise AssertionError(f"in a clean child process the kernel raised {reply['error']}")
        device = args[0].device
        result = reply["result"]
        return [self._decoded(r, by_key, device) for r in result] if isinstance(result, list) else \
            self._decoded(result, by_key, device)

    @staticmethod
    def _decoded(meta, by_key: dict, device):
        if not isinstance(meta, dict):
            return meta
        data = torch.frombuffer(bytearray(meta["bytes"]), dtype=torch.uint8) if meta["bytes"] else \
            torch.empty(0, dtype=torch.uint8)
        raw = by_key.get(meta["given"])
        if raw is not None:  # written into an argument (out=): the bytes land in the argument here
            raw.copy_(data.to(device))
        else:
            raw = data.to(device)
        return torch.empty(0, dtype=getattr(torch, meta["dtype"]), device=device).set_(
            raw.untyped_storage(), meta["offset"], meta["shape"], meta["stride"])

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._send(None)
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        if _CHILD and _CHILD[0] is self:
            _CHILD.clear()


def child() -> Child:
    """This process's child, started on first use (again if it died, or if the environment it
    would get changed: another session of the process, a kernel's configuration set anew)."""
    if not _CHILD or _CHILD[0].process.poll() is not None or _CHILD[0].env != environment():
        if _CHILD:
            _CHILD[0].close()
        _CHILD[:] = [Child()]
    return _CHILD[0]


@atexit.register
def _close() -> None:
    if _CHILD:
        _CHILD[0].close()
