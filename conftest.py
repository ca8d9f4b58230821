# The fmha pytest plugins: kernel selection, device, markers and reasoned skips (ci/plugin.py);
# GPU pinning per xdist worker and poisoned-context handling (ci/gpu_runner.py).
pytest_plugins = ["ci.plugin", "ci.gpu_runner"]
