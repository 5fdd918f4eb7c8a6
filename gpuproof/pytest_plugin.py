"""gpuproof's pytest plugin, under the name users know: the ``pytest11`` entry point, ``pytest_plugins =
["gpuproof.pytest_plugin"]`` in a conftest, and ``-p no:gpuproof.pytest_plugin`` to turn it off.

It only names the modules of :mod:`gpuproof.plugin` that hold the hooks and fixtures (loaded with it, and left
out with it). Suites use the fixtures ``target``, ``run``, ``discovery``, ``check``, ``run_dir`` and the
parametrizing fixtures ``gpu_node`` / ``gpu_pool`` (one test per discovered node or pool), and import check
helpers from :mod:`gpuproof.plugin.checks`.
"""

# options, configure/finish, parametrization; the fixtures; the `creates` marker for plans; the nodes each
# check left out; per-node checks on every node at once
pytest_plugins = ["gpuproof.plugin.hooks", "gpuproof.plugin.fixtures", "gpuproof.plugin.plan",
                  "gpuproof.plugin.coverage", "gpuproof.plugin.fanout"]


def pytest_addhooks(pluginmanager) -> None:
    """Progress lines + ETA, registered under the name ``-p no:gpuproof.progress`` turns off (refused when blocked)."""
    from gpuproof.plugin import progress

    if not pluginmanager.is_blocked("gpuproof.progress") and not pluginmanager.has_plugin("gpuproof.progress"):
        pluginmanager.register(progress, "gpuproof.progress")


def __getattr__(name: str):
    """``for_nodes`` and ``REAL_GPU_REASON`` for suites written before #24, found on first use: importing them up
    front would import the plugin's modules before pytest marks them for assertion rewriting."""
    if name == "for_nodes":
        from gpuproof.plugin.checks import for_nodes

        return for_nodes
    if name == "REAL_GPU_REASON":
        from gpuproof.plugin.target import REAL_GPU_REASON

        return REAL_GPU_REASON
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
