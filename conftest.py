# The fmha pytest plugin (fmha.ci.plugin, fmha.ci.gpu_runner) comes with the installed package
# through its pytest11 entry point; this checkout's folders are importable as fmha.* only once
# it is installed (`pip install -e ".[test]"`).
import importlib.util

import pytest

if importlib.util.find_spec("fmha.ci") is None:
    raise pytest.UsageError("fmha is not installed in this environment: run pip install -e \".[test]\" first")

# pytester's in-process sessions drop the modules first imported inside them when they end;
# Triton's C extension registers its submodules (triton._C.libtriton.linear_layout) once, so a
# Triton module first imported inside one (triton.tools, by fmha's dense kernel) cannot be
# imported again after it: the next test to import fmha's kernels failed. Imported here first.
if importlib.util.find_spec("triton") is not None:
    import triton.tools  # noqa: F401
