# gpuproof's pytest plugin: target cluster, run namespace, check records (see gpuproof/pytest_plugin.py).
pytest_plugins = ["gpuproof.pytest_plugin"]
