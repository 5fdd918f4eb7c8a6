# gpuproof's pytest plugin (target cluster, run namespace, check records; see gpuproof/pytest_plugin.py)
# is loaded by its entry point once gpuproof is installed (`pip install gpuproof`, or `./setup.sh` here).
# The entry point is named after the module, so this line is a no-op then (pytest finds the plugin
# registered); it only matters in a checkout run without an install or with PYTEST_DISABLE_PLUGIN_AUTOLOAD.
pytest_plugins = ["gpuproof.pytest_plugin"]
