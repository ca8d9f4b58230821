# The fmha pytest plugin: kernel selection, device, markers and reasoned skips (ci/plugin.py).
pytest_plugins = ["ci.plugin"]
