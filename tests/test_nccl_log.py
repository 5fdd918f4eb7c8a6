"""The NCCL log reader (workloads/nccl_log.py) over logs copied from public issues and guides.

Each file in tests/data/nccl/ is an unedited excerpt of a published log (tests/data/nccl/SOURCES.md names the source,
the hardware and what the reader reads); the tests hold the reader to the transport, the transports within a node,
the HCAs and the version of each, to the fall-back sentence on a socket log where RDMA was offered, and to empty
values on garbage. Pure and fast: no process, no cluster.
"""

from pathlib import Path

import pytest

from gpuproof.bench.workloads import import_workload

nccl_log = import_workload("nccl_log")

DATA = Path(__file__).parent / "data" / "nccl"


def log(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def sources_table() -> dict[str, dict[str, str]]:
    """file -> its row of SOURCES.md (column name -> cell)."""
    rows = [line.strip().strip("|").split("|") for line in (DATA / "SOURCES.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| ---")]
    header = [cell.strip() for cell in rows[0]]
    return {cells[0].strip(): dict(zip(header, (c.strip() for c in cells))) for cells in rows[1:]}


# file -> what read() must give (the keys named; intra and hcas in full)
EXPECTED = {
    "efa_p4d_eks_nccl2.9.9.log": dict(
        transport="EFA/GDRDMA", net_plugin="OFI", network="AWS Libfabric", ofi_provider="efa", nccl_version="2.9.9",
        intra=["P2P/IPC"], hcas=[], link_layer=None, gdr=True),
    "roce_gdrdma_nccl2.27.5.log": dict(
        transport="RoCE/GDRDMA", net_plugin="IB", network="IB", nccl_version="2.27.5", intra=["P2P/IPC"],
        hcas=["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_5:1", "mlx5_6:1", "mlx5_7:1", "mlx5_8:1", "mlx5_11:1"],
        link_layer="RoCE", nodes=2, gdr=True),
    "ib_a100_nogdr_issue1412.log": dict(
        transport="IB", net_plugin="IB", network=None, nccl_version=None, intra=["P2P/direct"], hcas=[], gdr=False),
    "ib_gdrdma_cumem_h20_issue1189.log": dict(
        transport="IB/GDRDMA", net_plugin="IB", intra=["P2P/CUMEM"], hcas=[], hosts=["H20-GPU-05", "H20-GPU-06"]),
    "ib_connected_rings_gdr0_meshplugin56.log": dict(transport="IB", intra=[], hosts=[], gdr=False),
    "nvls_ibext_h100_issue1357.log": dict(
        transport="IB", net_plugin="IB", network="IBext", intra=["NVLS"], link_layer="IB", nodes=2,
        hcas=["mlx5_0:1", "mlx5_1:1", "mlx5_4:1", "mlx5_5:1"], gdr=None),
    "shm_ib_issue1516.log": dict(transport="IB", intra=["SHM"], gdr=False),
    "roce_old_ring_form_issue392.log": dict(
        transport="RoCE", nccl_version="2.5.7", intra=["P2P/IPC", "SHM"], hcas=["mlx5_0:1"], link_layer="RoCE"),
    "socket_no_ib_device_issue952.log": dict(transport="Socket", net_plugin="Socket", intra=["P2P/IPC"], gdr=False),
    "socket_aws_no_ib_device_issue226.log": dict(transport="Socket", net_plugin="Socket", nccl_version="2.4.7",
                                                 intra=[], hcas=[]),
    "socket_pod_no_libibverbs_issue1410.log": dict(transport=None, net_plugin="Socket", network="Socket", intra=[]),
    "cumem_h100_no_net_line_nccltests252.log": dict(
        transport=None, net_plugin=None, nccl_version="2.21.5", intra=["P2P/CUMEM"], hosts=["kolyoz1", "kolyoz2"]),
    "tcpx_gke_a3high_lab18.log": dict(transport=None, net_plugin="GPUDirectTCPX", network="GPUDirectTCPX_v7",
                                      hosts=[]),
    "tcpxo_gke_a3mega_lab22.log": dict(transport="TCPXO", net_plugin="FasTrak", network="FasTrak",
                                       hosts=["tcpxo-wb-0", "tcpxo-wb-1"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_recorded_log_reads_to_its_transport(name):
    found = nccl_log.read(log(name))
    assert {key: found[key] for key in EXPECTED[name]} == EXPECTED[name]
    assert found["lines"] == len(log(name).splitlines())       # the excerpts hold NCCL lines only
    assert nccl_log.inter_node(found) is (found["transport"] is not None)
    if found["transport"]:
        assert found["evidence"] in log(name).splitlines()     # the deciding line, as printed


def test_every_log_has_a_row_in_sources_and_the_row_says_what_read_gives():
    table = sources_table()
    files = sorted(p.name for p in DATA.iterdir() if p.name != "SOURCES.md")
    assert sorted(table) == files
    assert set(EXPECTED) == set(files)                            # and each is held to more above
    for name, row in table.items():
        assert row["source"].startswith("https://github.com/"), name
        assert row["hardware"] and row["NCCL version"], name
        assert row["transport read"] == (nccl_log.read(log(name))["transport"] or "none"), name


def test_the_transports_between_nodes_and_within_a_node_are_all_covered():
    read = [nccl_log.read(log(name)) for name in EXPECTED]
    between = {r["transport"] for r in read}
    assert {"IB", "IB/GDRDMA", "RoCE", "RoCE/GDRDMA", "EFA/GDRDMA", "TCPXO", "Socket", None} <= between
    within = set().union(*(r["intra"] for r in read))
    assert {"P2P/IPC", "P2P/CUMEM", "P2P/direct", "SHM", "NVLS"} <= within


def test_the_old_per_channel_form_and_the_banner_form():
    old = nccl_log.read(log("roce_old_ring_form_issue392.log"))              # Ring 00 : ... via NET/IB/0
    assert old["peers"]["15->0"] == "NET/IB/0" and old["peers"]["0->7"] == "direct shared memory"
    assert old["network"] is None
    banner = nccl_log.read(log("nvls_ibext_h100_issue1357.log"))             # no channel line: nNodes 2 + banner
    assert banner["peers"] == {} and banner["evidence"].endswith("NCCL INFO Using network IBext")
    assert banner["networks"] == ["IBext"]


def test_channel_lines_name_the_peers_and_a_failed_plugin_does_not_count():
    found = nccl_log.read(log("roce_gdrdma_nccl2.27.5.log"))
    assert found["peers"]["1->8"] == "NET/IB/0/GDRDMA" and found["peers"]["8->15"] == "P2P/IPC"
    # aws-ofi-nccl was loaded and picked verbs, then failed: NCCL's own IB carried the traffic
    assert found["ofi_provider"] == "verbs" and found["net_plugin"] == "IB"
    assert found["warnings"] == ["tpgds-aihub0008:207007:207007 [0] NCCL INFO NET/OFI Invalid type of PCI bus "
                                 "returned 0"]
    # `NCCL_IB_DISABLE set by environment to 0.` is in the log and is no reason for anything
    assert not any("NCCL_IB_DISABLE" in w for w in found["warnings"])


def test_a_prefixed_multi_process_log_keeps_the_hosts_apart():
    found = nccl_log.read(log("efa_p4d_eks_nccl2.9.9.log"))                  # mpirun's [1,N]<stdout>: prefix
    assert found["hosts"] == ["nccl-tests-efa-16-worker-0", "nccl-tests-efa-16-worker-1"]
    assert "NET" not in found["intra"]                                      # every NET channel crosses the nodes
    assert found["evidence"].startswith("[1,1]<stdout>:nccl-tests-efa-16-worker-0:26:68 [1] NCCL INFO Channel 00 :")


def test_warnings_are_the_fallback_lines_once_each():
    pod = nccl_log.read(log("socket_pod_no_libibverbs_issue1410.log"))
    assert pod["warnings"] == ["h100-kickoff-llama-70b-chat-20230328-bcf75c4f6-gn6nd:2340:2384 [4] NCCL INFO "
                               "Failed to open libibverbs.so[.1]"]
    aws = nccl_log.read(log("socket_aws_no_ib_device_issue226.log"))
    assert aws["warnings"] == ["ip-172-31-0-11:45384:45384 [0] NCCL INFO NET/IB : No device found."]
    assert nccl_log.read(log("ib_gdrdma_cumem_h20_issue1189.log"))["warnings"] == []


# ---------------------------------------------------------------- socket_fallback


@pytest.mark.parametrize("name, offers", [
    ("socket_no_ib_device_issue952.log", ["rdma/ib"]),
    ("socket_aws_no_ib_device_issue226.log", ["vpc.amazonaws.com/efa", "rdma/rdma_shared_device_a"]),
])
def test_socket_between_nodes_where_rdma_is_offered_is_a_fallback(name, offers):
    found = nccl_log.read(log(name))
    sentence = nccl_log.socket_fallback(found, offers)
    assert sentence is not None
    assert all(offer in sentence for offer in offers)
    assert found["evidence"] in sentence
    for warning in found["warnings"]:
        assert warning in sentence                                          # the telling one, where there is one
    assert sentence.count(".\n") == 0 and sentence.endswith(".")


def test_the_fallback_sentence_quotes_the_missing_device():
    found = nccl_log.read(log("socket_aws_no_ib_device_issue226.log"))
    assert nccl_log.socket_fallback(found, ["mlx5_0"]) == (
        "NCCL sent the traffic between nodes over TCP sockets although the node offers RDMA (mlx5_0): it logged "
        "\"ip-172-31-10-182:45407:45407 [0] NCCL INFO NET/Socket : Using [0]ens3:172.31.10.182<0>\", and before that "
        "\"ip-172-31-0-11:45384:45384 [0] NCCL INFO NET/IB : No device found.\".")


@pytest.mark.parametrize("name", [n for n in sorted(EXPECTED) if not n.startswith("socket_")])
def test_no_fallback_on_rdma_logs_and_logs_without_traffic_between_nodes(name):
    assert nccl_log.socket_fallback(nccl_log.read(log(name)), ["rdma/ib", "nvidia.com/hostdev"]) is None


def test_no_fallback_without_an_offer_or_without_traffic_between_nodes():
    socket = nccl_log.read(log("socket_no_ib_device_issue952.log"))
    assert nccl_log.socket_fallback(socket, []) is None
    assert nccl_log.socket_fallback(socket, ["  "]) is None
    # the pod logged `Using network Socket` and a missing libibverbs, but no line between nodes: not a fall-back,
    # and visible as transport None
    pod = nccl_log.read(log("socket_pod_no_libibverbs_issue1410.log"))
    assert pod["transport"] is None and nccl_log.socket_fallback(pod, ["rdma/ib"]) is None
    # RDMA offered, a two-node log, but not one NET line: not a fall-back either
    quiet = nccl_log.read(log("cumem_h100_no_net_line_nccltests252.log"))
    assert quiet["transport"] is None and nccl_log.socket_fallback(quiet, ["rdma/ib"]) is None


# ---------------------------------------------------------------- summary and garbage


def test_summary_lines():
    assert nccl_log.summary(nccl_log.read(log("roce_gdrdma_nccl2.27.5.log"))) == (
        "RoCE/GDRDMA over mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_5:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_11:1 (NCCL 2.27.5); "
        "within node P2P/IPC; 1 fall-back warning(s)")
    assert nccl_log.summary(nccl_log.read(log("nvls_ibext_h100_issue1357.log"))) == (
        "IB over mlx5_0:1,mlx5_1:1,mlx5_4:1,mlx5_5:1; within node NVLS")
    assert nccl_log.summary(nccl_log.read(log("efa_p4d_eks_nccl2.9.9.log"))) == (
        "EFA/GDRDMA (NCCL 2.9.9); within node P2P/IPC")
    assert nccl_log.summary(nccl_log.read(log("socket_pod_no_libibverbs_issue1410.log"))) == (
        "no traffic between nodes seen (network Socket); 1 fall-back warning(s)")
    assert nccl_log.summary(nccl_log.read("")) == "no NCCL log lines"


@pytest.mark.parametrize("junk", [
    "", "\n\n", "hello world", None, 42, b"\xff\xfe NCCL INFO \x00", "NCCL INFO", "NCCL INFO Channel 00/0 : x -> y",
    "NCCL INFO Using network", "NCCL WARN", "x:1:2 [3] NCCL INFO NET/IB : Using [0]", "NCCL version x.y",
    "\x00" * 100, "NCCL INFO comm 0x12 rank z nRanks 2 nNodes many",
])
def test_garbage_reads_as_empty_values_and_never_raises(junk):
    found = nccl_log.read(junk)
    assert found["transport"] is None and found["evidence"] is None and found["nccl_version"] is None
    assert found["hcas"] == [] and found["intra"] == [] and found["peers"] == {} and found["warnings"] == []
    assert nccl_log.inter_node(found) is False
    assert nccl_log.socket_fallback(found, ["rdma/ib"]) is None
    assert isinstance(nccl_log.summary(found), str)


def test_helpers_take_nothing_gracefully():
    assert nccl_log.inter_node({}) is False and nccl_log.inter_node(None) is False
    assert nccl_log.socket_fallback({}, ["rdma/ib"]) is None and nccl_log.socket_fallback(None, None) is None
    assert nccl_log.summary({}) == "no NCCL log lines"
    assert [nccl_log.net_family(n) for n in ("IBext_v8", "AWS Libfabric", "GPUDirectTCPX_v7", "FasTrak", "Socket")] \
        == ["IB", "OFI", "GPUDirectTCPX", "FasTrak", "Socket"]
