"""The inference engine's step on the CPU (issue #42 item 6): every step timed (the server's CPU against the
device's time), the decode step through captured graphs (a stand-in for CUDA graphs on the CPU, the real ones
where torch has a GPU), what bound a step by that ratio, and the records that carry it."""

import math

import pytest

from gpuproof.bench import get
from gpuproof.bench.workloads import import_workload

# torch at collection: its first import runs ldconfig, a process the unit tier's guard refuses inside a test
torch = pytest.importorskip("torch")
llm = import_workload("llm_model")
llm_step = import_workload("llm_step")
rules = import_workload("loadclient")


class StandInGraphs:
    """What CudaGraphs does, on the CPU: "capture" keeps the function and its output tensor, "replay" runs the
    function again and writes its result into that same tensor (a graph's static output)."""

    name = "stand-in"

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.captured = 0

    def capture(self, fn):
        if self.fail:
            raise RuntimeError("capture refused")
        out = fn()
        self.captured += 1

        def replay():
            with torch.inference_mode():   # the output is an inference tensor; a real graph writes it in place
                out.copy_(fn())

        return replay, out


def serve(engine, prompts, max_tokens):
    """Every request through the engine; its tokens, in order of submission."""
    engine.start()
    try:
        reqs = [llm.Request(p, max_tokens=m, ignore_eos=True) for p, m in zip(prompts, max_tokens)]
        for r in reqs:
            engine.submit(r)
        out = []
        for r in reqs:
            toks = []
            while (t := r.out.get(timeout=60)) is not None:
                toks.append(t)
            assert r.error is None, r.error
            out.append(toks)
        return out, engine.snapshot()
    finally:
        engine.stop()


PROMPTS = [[1 + i, 2, 3, 4 + i] for i in range(7)]
MAX_TOKENS = [3 + 5 * (i % 3) for i in range(7)]   # sequences leave at different steps: the batch is compacted


def tiny(slots=4, max_seq=96):
    return llm.LLM(2, 64, 4, 512, max_seq, slots=slots, device="cpu", seed=3)


def test_every_engine_step_is_timed_on_the_cpu():
    tokens, snap = serve(llm.Engine(tiny()), PROMPTS, MAX_TOKENS)
    assert [len(t) for t in tokens] == MAX_TOKENS
    assert snap["device_timer"] == "wall" and snap["cuda_graphs"] == "off" and snap["graph_steps"] == 0
    steps = snap["steps"]
    assert steps > 0 and snap["cpu_s"] > 0 and snap["device_s"] > 0
    # the device's time is the forward calls' wall time: within the forward time the engine already kept
    assert snap["device_s"] <= snap["forward_s"] * 1.01 + 1e-6 and snap["forward_s"] <= snap["busy_s"]
    per = rules.engine_steps({}, snap, dw=snap["busy_s"])
    assert per["engine_steps"] == steps and per["cpu_ms_per_step"] > 0 and per["device_ms_per_step"] > 0
    assert math.isfinite(per["cpu_per_device_step"]) and per["cpu_per_device_step"] > 0
    assert per["tokens_per_step"] == pytest.approx((snap["prefill_tokens"] + snap["decode_tokens"]) / steps)


def test_the_step_clock_leaves_out_the_wait_and_on_the_cpu_the_compute():
    clock = llm_step.StepClock("cpu")
    clock.begin()
    with clock.forward():
        sum(i * i for i in range(200_000))    # "compute": the device's time on the CPU, not the server's
    with clock.wait():
        sum(i * i for i in range(200_000))    # a wait for the device: not the server's either
    sum(i for i in range(20_000))             # the scheduler's own Python
    cpu, device = clock.end()
    assert 0 < cpu < device


def test_graph_decode_gives_the_eager_tokens():
    """Batch and span rounded up to buckets, padded rows in free slots, a graph per bucket: the same tokens."""
    eager, _ = serve(llm.Engine(tiny()), PROMPTS, MAX_TOKENS)
    model = tiny()
    backend = StandInGraphs()
    graphs = llm_step.GraphDecoder(model, backend=backend, min_span=8)
    assert graphs.batch_sizes == [1, 2, 4] and graphs.spans == [8, 16, 32, 64, 96]
    tokens, snap = serve(llm.Engine(model, graphs=graphs), PROMPTS, MAX_TOKENS)
    assert tokens == eager
    assert snap["cuda_graphs"] == "on" and snap["graph_steps"] == snap["decode_steps"] > 0
    assert backend.captured == len(graphs.graphs) >= 3    # several batch sizes and spans met


def test_capture_all_captures_every_bucket_once():
    model = tiny(slots=3, max_seq=40)
    backend = StandInGraphs()
    graphs = llm_step.GraphDecoder(model, backend=backend, min_span=16)
    assert graphs.capture_all() == backend.captured == len(graphs.batch_sizes) * len(graphs.spans) == 3 * 3
    assert graphs.capture_all() == 9 and backend.captured == 9
    assert llm_step.bucket(graphs.batch_sizes, 3) == 3 and llm_step.bucket(graphs.spans, 17) == 32
    with pytest.raises(ValueError):
        llm_step.bucket(graphs.spans, 41)


def test_a_graph_that_fails_falls_back_to_eager_decoding():
    eager, _ = serve(llm.Engine(tiny()), PROMPTS[:3], MAX_TOKENS[:3])
    model = tiny()
    graphs = llm_step.GraphDecoder(model, backend=StandInGraphs(fail=True))
    tokens, snap = serve(llm.Engine(model, graphs=graphs), PROMPTS[:3], MAX_TOKENS[:3])
    assert tokens == eager
    assert snap["cuda_graphs"] == "failed: RuntimeError: capture refused" and snap["graph_steps"] == 0


def test_cuda_graphs_and_events_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA graphs and event timing run on a GPU session")
    make = lambda: llm.LLM(2, 256, 4, 1024, 128, slots=8, device="cuda", dtype=torch.float32, seed=3)  # noqa: E731
    eager, _ = serve(llm.Engine(make()), PROMPTS, MAX_TOKENS)
    model = make()
    graphs = llm_step.GraphDecoder(model)
    assert graphs.capture_all() == len(graphs.batch_sizes) * len(graphs.spans)
    tokens, snap = serve(llm.Engine(model, graphs=graphs), PROMPTS, MAX_TOKENS)
    assert snap["cuda_graphs"] == "on" and snap["device_timer"] == "cuda-events"
    assert snap["graph_steps"] > 0 and snap["device_s"] > 0 and snap["cpu_s"] > 0
    same = sum(a == b for a, b in zip(tokens, eager))
    assert same >= len(eager) - 1, (tokens, eager)   # float32: the padded span may flip a near tie, rarely


# ------------------------------------------------------------------ what bound a step, and the records


def failing_step(gpu, ratio, timer="cuda-events"):
    return {"offered_rps": 16.0, "sent_rps": 16.0, "errors": 0, "late_fraction": 0.0, "keeps_pace": False,
            "completion_rps": 13.0, "schedule_lag_p95_ms": 1.0, "starved_fraction": 0.0,
            "server": {"engine_busy": 0.99, "cpu_util": 1.01, "gpu_util_pct": gpu, "device_timer": timer,
                       "cpu_ms_per_step": 7.0 * ratio, "device_ms_per_step": 7.0, "cpu_per_device_step": ratio},
            "headroom": {"running_mean": 60, "max_batch": 64, "slots_used": 60 / 64, "waiting_mean": 5.0,
                         "kv_cache_usage_mean": None}}


def test_a_gpu_that_waits_for_the_servers_python_is_server_bound():
    bound, why = rules.classify(failing_step(gpu=95.0, ratio=1.05), 0.75)   # NVML busy, but fed by Python
    assert bound == "server" and "Python bounds the GPU" in why and "ratio 1.05" in why, why
    bound, why = rules.classify(failing_step(gpu=95.0, ratio=0.2), 0.75)    # the GPU's own work
    assert bound == "device" and why.startswith("GPU busy 95%"), why
    bound, why = rules.classify(failing_step(gpu=None, ratio=1.5, timer="wall"), 0.75)   # the CPU path
    assert bound == "server" and "Python" not in why and why.startswith("server saturated"), why


def test_the_records_carry_the_step_timing_with_units():
    bench = get("inference")
    srv = failing_step(gpu=None, ratio=0.05, timer="wall")["server"]
    srv.update(tokens_per_step=9.5, device_busy=0.9, engine_steps=40)
    step = {"step": 1, "offered_rps": 4.0, "server": srv}
    result = {"device": "cpu", "load": {"steps": [step], "capacity_rps": 4.0, "bound_by": "server",
                                        "bound_reason": "x", "at_capacity": {"server": srv}},
              "server": {"per_step": {"steps": 40, "cpu_ms": 0.35, "device_ms": 7.0, "cpu_per_device": 0.05,
                                      "tokens_per_step": 9.5, "device_share_of_busy": 0.95,
                                      "device_timer": "wall", "cuda_graphs": "off"}}}
    recs = {(r.metric, r.parameters.get("step")): r for r in bench.to_records(result, node="local", product="cpu")}
    want = {"server_cpu_ms_per_step": "ms", "device_ms_per_step": "ms", "cpu_per_device_step": "ratio",
            "tokens_per_step": "tokens", "device_busy": "ratio"}
    for metric, unit in want.items():
        assert recs[metric, 1].unit == unit and recs[f"capacity_{metric}", None].unit == unit, metric
    assert recs["cpu_per_device_step", 1].value == pytest.approx(0.05)
    run = {"run_server_cpu_ms_per_step": ("ms", 0.35), "run_device_ms_per_step": ("ms", 7.0),
           "run_cpu_per_device_step": ("ratio", 0.05), "run_tokens_per_step": ("tokens", 9.5),
           "run_engine_steps": ("count", 40), "run_device_share_of_busy": ("ratio", 0.95)}
    for metric, (unit, value) in run.items():
        r = recs[metric, None]
        assert (r.unit, r.value) == (unit, pytest.approx(value)), metric
        assert r.parameters["device_timer"] == "wall" and r.parameters["cuda_graphs"] == "off"
    head = bench.headline(result)
    assert "server's CPU 0.35 ms against the device's 7.00 ms (wall): ratio 0.05" in head, head
