# The fmha pytest plugin (fmha.ci.plugin, fmha.ci.gpu_runner) comes with the installed package
# through its pytest11 entry point; this checkout's folders are importable as fmha.* only once
# it is installed (`pip install -e ".[test]"`).
import importlib.util

import pytest

if importlib.util.find_spec("fmha.ci") is None:
    raise pytest.UsageError("fmha is not installed in this environment: run pip install -e \".[test]\" first")
