"""The token bucket that bounds the run's requests (--api-qps) and the fan-out's pod starts (issue #52 item 1)."""

from __future__ import annotations

import threading

import pytest
import urllib3

from gpuproof.cluster.api import InFlight, api_qps_from, connect
from gpuproof.cluster.rate import TokenBucket
from gpuproof.errors import ClusterError


def test_a_burst_is_taken_at_once_then_a_waiter_hears_its_stop():
    bucket = TokenBucket(rate=0.001, burst=3)
    assert all(bucket.take(stop=threading.Event()) for _ in range(3)) and bucket.taken == 3
    stop = threading.Event()
    stop.set()
    assert bucket.take(stop=stop) is False            # no token for ~1000 s: the stop ends the wait
    assert bucket.take(10, stop=stop) is False        # more than the burst asks for the burst, no more


def test_the_rate_comes_from_the_option_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv("GPUPROOF_API_QPS", raising=False)
    assert api_qps_from(None) == 50.0 and api_qps_from(7) == 7.0 and api_qps_from("0") == 0.0
    monkeypatch.setenv("GPUPROOF_API_QPS", "12.5")
    assert api_qps_from(None) == 12.5
    for bad in ("fast", -1):
        with pytest.raises(ClusterError) as err:
            api_qps_from(bad)
        assert "request rate" in str(err.value) and "\n" not in str(err.value)


def test_every_request_but_a_watch_goes_through_the_bucket(tmp_path):
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]"
                          "\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
                          "users: [{name: u, user: {token: t}}]\n")
    cluster = connect(str(kubeconfig), check=False, qps=5)
    inflight: InFlight = cluster.api.gpuproof_inflight
    assert inflight.bucket.rate == 5 and inflight.bucket.burst == 100
    before = inflight.bucket.taken          # nothing listens at port 9: each request fails, after its token
    with pytest.raises(urllib3.exceptions.HTTPError):
        cluster.core.list_namespace(_request_timeout=1)
    with pytest.raises(urllib3.exceptions.HTTPError):
        cluster.core.list_namespace(watch=True, _request_timeout=1)
    assert inflight.bucket.taken == before + 1        # the list took a token, the watch none
    assert connect(str(kubeconfig), check=False, qps=0).api.gpuproof_inflight.bucket is None
