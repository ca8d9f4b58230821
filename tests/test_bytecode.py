"""Where Python writes no bytecode, a distributed session's processes share one cache of it
(fmha.ci.bytecode): each xdist worker and each process a test starts read what the session
compiled before they started, instead of compiling every module they import."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fmha.ci import bytecode

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.cpu_tier  # the environment of a run's processes, whatever the device


def _python(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    environment = bytecode.without_the_cache(os.environ)  # this run's own session may have shared one
    environment.update(PYTHONPATH=str(tmp_path), FMHA_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, timeout=120)


def test_without_bytecode_the_session_fills_one_cache_and_its_children_read_it(tmp_path):
    (tmp_path / "never_compiled.py").write_text("VALUE = 7\n")
    run = _python('''
        import json, os, sys
        import never_compiled
        from fmha.ci import bytecode
        cache = bytecode.share(jobs=2)
        child = dict(os.environ)
        bytecode.restore()
        print(json.dumps({"cache": str(cache), "child": {k: child.get(k) for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")},
                          "after": {k: os.environ.get(k) for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}}))
    ''', tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout)
    cache = tmp_path / "cache" / "pycache"
    assert said["cache"] == str(cache) and said["child"] == {"PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": None}
    assert said["after"] == {"PYTHONPYCACHEPREFIX": None, "PYTHONDONTWRITEBYTECODE": "1"}  # as it was
    compiled = {p.name.split(".")[0] for p in cache.rglob("*.pyc")}
    assert {"never_compiled", "bytecode", "__init__"} <= compiled, sorted(compiled)[:20]
    assert not (tmp_path / "__pycache__").exists()  # nothing beside the sources


def test_where_python_writes_bytecode_nothing_changes(tmp_path):
    run = _python('''
        import os
        from fmha.ci import bytecode
        print(bytecode.share(jobs=2), os.environ.get("PYTHONPYCACHEPREFIX"))
    ''', tmp_path, PYTHONDONTWRITEBYTECODE="")
    assert run.returncode == 0 and run.stdout.split() == ["None", "None"], run.stdout + run.stderr


@pytest.mark.starts_first  # a nested two-worker session
def test_a_distributed_sessions_workers_get_the_cache(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("FMHA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv(bytecode.SAVED, raising=False)  # this run's own session may have shared one
    pytester.makepyfile(test_session=textwrap.dedent('''
        import os

        def test_environment():
            assert os.environ.get("PYTHONPYCACHEPREFIX", "").endswith("pycache"), dict(os.environ)
            assert "PYTHONDONTWRITEBYTECODE" not in os.environ
    '''))
    (pytester.path / "conftest.py").write_text("# a module of the session's with no bytecode beside it\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fmha-device=cpu", "-n", "2").assert_outcomes(passed=1)
    assert any((tmp_path / "cache" / "pycache").rglob("*.pyc"))
