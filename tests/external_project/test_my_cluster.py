"""Checks of my own, using gpuproof's cluster fixtures (target, run, discovery)."""


def test_the_gpu_pool_is_there(discovery):
    products = {n.product for n in discovery.gpu_nodes}
    assert "NVIDIA-L4" in products, products
    assert all(n.allocatable.get("nvidia.com/gpu") == "1" for n in discovery.gpu_nodes)


def test_my_run_has_its_own_namespace(target, run):
    ns = target.cluster.core.read_namespace(run.namespace)
    assert ns.status.phase == "Active"
    assert ns.metadata.labels.get("app.kubernetes.io/managed-by") == "gpuproof"


def test_options_have_gpuproof_names(pytestconfig):
    assert pytestconfig.getoption("--gpuproof-fleet") == pytestconfig.getoption("--fleet") == "minimal"
