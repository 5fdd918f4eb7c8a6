"""Shared helpers for the acceptance suites live in gpuproof.plugin.checks; fixtures in gpuproof.pytest_plugin.

Options only the suites read are added here.
"""


def pytest_addoption(parser):
    parser.getgroup("gpuproof").addoption(
        "--gfd-max-age", type=float, default=3600.0, metavar="SECONDS",
        help="oldest nvidia.com/gfd.timestamp that counts as fresh (GFD relabels every minute by default); "
             "default 3600")
    parser.getgroup("gpuproof").addoption(
        "--prometheus", default=None, metavar="URL",
        help="a Prometheus that scrapes the DCGM exporter: the monitoring suite checks each GPU's series reach it "
             "with the workload's pod label (default: the cluster's own, found among its Services, e.g. "
             "kube-prometheus-stack's, and read through the API server's service proxy)")
    parser.getgroup("gpuproof").addoption(
        "--prometheus-selector", default="", metavar="LABELS",
        help='extra label matchers for the monitoring suite\'s Prometheus queries, e.g. \'job="dcgm-exporter"\'')
