"""Shared helpers for the acceptance suites live in gpuproof.plugin.checks; fixtures in gpuproof.pytest_plugin.

Options only the suites read are added here.
"""


def pytest_addoption(parser):
    parser.getgroup("gpuproof").addoption(
        "--gfd-max-age", type=float, default=3600.0, metavar="SECONDS",
        help="oldest nvidia.com/gfd.timestamp that counts as fresh (GFD relabels every minute by default); "
             "default 3600")
