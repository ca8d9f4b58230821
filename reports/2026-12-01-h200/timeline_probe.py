"""Throwaway probe (not committed): per-process timestamps of a pytest -n run."""
import json, os, time
import pytest

_T0 = time.time()
_F = None

def _log(**kw):
    global _F
    if _F is None:
        os.makedirs("/tmp/timeline", exist_ok=True)
        _F = open(f"/tmp/timeline/{os.environ.get('PYTEST_XDIST_WORKER', 'controller')}-{os.getpid()}.jsonl", "a")
    kw["t"] = time.time()
    _F.write(json.dumps(kw) + "\n"); _F.flush()

_log(ev="import", t_import=_T0)

def pytest_configure(config):
    _log(ev="configure")

def pytest_collection_finish(session):
    _log(ev="collection_finish", n=len(session.items))

def pytest_runtest_logstart(nodeid, location):
    _log(ev="start", id=nodeid)

def pytest_runtest_logfinish(nodeid, location):
    _log(ev="finish", id=nodeid)

def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        _log(ev="report", id=report.nodeid, when=report.when)

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _log(ev="node_collected", node=node.gateway.id, n=len(ids))

def pytest_sessionfinish(session):
    import torch
    mem = {}
    if torch.cuda.is_initialized():
        mem = dict(allocated=torch.cuda.max_memory_allocated(), reserved=torch.cuda.max_memory_reserved())
    _log(ev="sessionfinish", **mem)
