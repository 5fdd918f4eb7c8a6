"""Starting and stopping the load workloads' servers (inference server, loadstub) as processes on 127.0.0.1."""

import json
import os
import subprocess
import sys

from gpuproof.bench.workloads import WORKLOADS_DIR, import_workload

wait_until = import_workload("workload_common").wait_until
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def last_json(text):
    return json.loads([line for line in text.splitlines() if line.strip()][-1])


def loadgen_child(code: str, *args) -> object:
    """The JSON of the last line ``code`` prints, run in a child interpreter with workloads/ as its
    ``sys.argv[1]`` and ``args`` after it: loadgen monkey-patches the process for gevent when imported,
    so its rules are tried there, not in the test's process."""
    proc = subprocess.run([sys.executable, "-c", code, str(WORKLOADS_DIR), *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def ahead(nice: int):
    """A preexec function that raises the child's CPU priority by ``nice`` (a negative number) where it may (root):
    a test that times a load generator against a known service rate measures the rate, not the machine's other work
    (a CI's test workers starting clusters at once held its sends back). Unprivileged, the child runs as it would."""
    def enter() -> None:
        try:
            os.nice(nice)
        except OSError:
            pass
    return enter if nice else None


def start_process(script, tmp_path, *args, nice: int = 0):
    """A workload server on 127.0.0.1 and a free port (its --port-file); returns (url, process). ``nice``: ahead()."""
    port_file = tmp_path / f"{script}.port"
    port_file.unlink(missing_ok=True)           # an earlier server's, in the same folder
    proc = subprocess.Popen([sys.executable, str(WORKLOADS_DIR / script), "--host", "127.0.0.1", "--port", "0",
                             "--port-file", str(port_file), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=ahead(nice))
    port = wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 90, f"{script}'s port file")
    return f"http://127.0.0.1:{port}", proc


def stop_process(proc) -> dict:
    """SIGTERM, then its JSON summary (both servers print one on SIGTERM)."""
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return last_json(out)

