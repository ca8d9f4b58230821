"""Triton's interpreter without two costs that change nothing it computes or checks.

The CPU tier runs fmha's Triton kernels through Triton's interpreter, where every operation is
a stack of Python calls. Profiled on Triton 3.6 (cProfile over `fmha`'s agreement law), two
costs were half of an interpreted kernel's time and bought nothing:

- Every int32 add, subtract and multiply is computed again in int64 and compared with int32's
  range, for an overflow assertion that the interpreter then drops: its semantic layer asserts
  only with the `debug` option on, and the interpreter's options have it off (an int32 sum past
  2^31 - 1 wraps without a word; tests/test_interpreter.py shows it). Six more operations for
  each one.
- Every call of a `@triton.jit` function from inside a kernel (tl.max, tl.sum, fmha's helpers)
  installs the interpreter's versions of triton.language's builtins again, walking the modules
  with inspect.getmembers, although the launch installed the same ones before its first program.

`install` skips both, on the Triton versions it was checked against, and says whether it did;
on any other it does nothing and the kernels run as they are, slower. A skipped re-install is
one the launch has already made for the same modules: builtins installed in a launch stay until
it ends. tests/test_interpreter.py holds the kernels' bits with and without it.
"""

from __future__ import annotations

import dataclasses
import inspect

CHECKED_VERSIONS = ("3.6.",)

_original: dict = {}


def install() -> bool:
    """Skip the dropped overflow checks and the repeated installs in this process, if Triton's
    version is one this was checked against; True if they are skipped (now or before)."""
    import triton
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    if _original:
        return True
    if not triton.__version__.startswith(CHECKED_VERSIONS):
        return False
    builder = interpreter.interpreter_builder
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    installed: set = set()  # the language modules this launch has installed builtins in
    modules_of: dict = {}

    def patch_lang_once_per_launch(fn):
        modules = modules_of.get(fn)
        if modules is None:
            modules = modules_of[fn] = frozenset(
                id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core))
        if modules in installed:
            return _NOTHING_TO_RESTORE
        scope = patch_lang(fn)
        installed.add(modules)
        return scope

    def launch_then_forget(self, *args, **kwargs):
        installed.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            installed.clear()  # the launch restores what it installed

    _original.update(options=builder.options, patch_lang=patch_lang, launch=launch)
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    interpreter._patch_lang = patch_lang_once_per_launch
    interpreter.GridExecutor.__call__ = launch_then_forget
    return True


def uninstall() -> None:
    """Triton's interpreter as it was (for tests/test_interpreter.py's comparison)."""
    import triton.runtime.interpreter as interpreter

    if _original:
        interpreter.interpreter_builder.options = _original["options"]
        interpreter._patch_lang = _original["patch_lang"]
        interpreter.GridExecutor.__call__ = _original["launch"]
        _original.clear()


class _NothingToRestore:
    def restore(self):
        pass


_NOTHING_TO_RESTORE = _NothingToRestore()
