"""NVIDIA's AIPerf (PyPI ``aiperf``) as the reference load client: find it, give it a tokenizer
that works offline, run one constant-rate profile and read its figures.

Used by ``tests/test_aiperf_parity.py`` and ``benchmarks/aiperf_compare.py``. AIPerf is a
test-only extra (``pip install 'gpuproof[aiperf]'``); it may also live in a virtual
environment of its own (``$GPUPROOF_AIPERF`` = its ``aiperf`` executable), since its pins
differ from the bench extra's.

The tokenizer: AIPerf counts tokens with a Hugging Face tokenizer, and no model hub is
reachable. gpuproof's servers make one token per whitespace-separated word (the stub writes
``" w5"``, the model server ``" w123"``), so a word-level tokenizer with a whitespace
pre-tokenizer counts exactly what they count. Its vocabulary is the words of AIPerf's own
prompt corpus, so the prompts AIPerf builds from it decode to real words, one token each;
every other word is ``[UNK]``, still one token.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

AIPERF_VERSION = "0.13.0"
ENV_VAR = "GPUPROOF_AIPERF"

# run by the interpreter AIPerf is installed in (it has tokenizers and transformers)
TOKENIZER_SCRIPT = r'''
import pathlib, sys
import aiperf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

corpus = pathlib.Path(aiperf.__file__).parent / "dataset" / "generator" / "assets" / "shakespeare.txt"
words = sorted(set(corpus.read_text(encoding="utf-8").split()))
vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", clean_up_tokenization_spaces=False)
fast.save_pretrained(sys.argv[1])
print(aiperf.__version__ if hasattr(aiperf, "__version__") else "")
'''


def find_aiperf() -> Path | None:
    """``$GPUPROOF_AIPERF``, else ``aiperf`` beside this interpreter, else on PATH; None when absent."""
    var = os.environ.get(ENV_VAR)
    if var:
        return Path(var)
    here = Path(sys.executable).parent / "aiperf"
    if here.is_file():
        return here
    found = shutil.which("aiperf")
    return Path(found) if found else None


def interpreter(aiperf: Path) -> Path:
    """The Python that runs the ``aiperf`` console script (its virtual environment's)."""
    beside = aiperf.parent / "python"
    return beside if beside.exists() else Path(sys.executable)


def build_tokenizer(aiperf: Path, out_dir: Path) -> Path:
    """A word-level tokenizer (see the module doc) saved under ``out_dir``; its path for ``--tokenizer``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / "tokenizer.json").exists():
        subprocess.run([str(interpreter(aiperf)), "-c", TOKENIZER_SCRIPT, str(out_dir)], check=True,
                       capture_output=True, text=True, timeout=300,
                       env=env())
    return out_dir


def command(aiperf: Path, url: str, model: str, tokenizer: Path, artifact_dir: Path, *, rate: float, count: int,
            input_tokens: int, output_tokens: int) -> list[str]:
    """``aiperf profile``: streamed completions at a constant ``rate`` until ``count`` requests, exactly
    ``input_tokens`` in and ``max_tokens = output_tokens`` (with ``ignore_eos``/``min_tokens``)."""
    return [str(aiperf), "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
            "--use-legacy-max-tokens", "--tokenizer", str(tokenizer),
            "--prompt-input-tokens-mean", str(input_tokens), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(output_tokens), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{output_tokens}",
            "--request-rate", f"{rate:g}", "--arrival-pattern", "constant", "--request-count", str(count),
            "--random-seed", "0", "--output-artifact-dir", str(artifact_dir), "--ui-type", "none",
            "--no-server-metrics", "--no-gpu-telemetry"]


def env() -> dict:
    """AIPerf's environment. Not HF_HUB_OFFLINE: with it AIPerf 0.13 takes a local tokenizer path for a
    hub repository id and refuses it; a local path needs no network either way."""
    return {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}


def summary(artifact_dir: Path) -> dict:
    """AIPerf's figures from its exports, under gpuproof's names (ms, req/s)."""
    agg = json.loads((artifact_dir / "profile_export_aiperf.json").read_text())
    starts, ends = [], []
    with open(artifact_dir / "profile_export.jsonl") as f:
        for line in f:
            meta = json.loads(line)["metadata"]
            starts.append(meta["request_start_ns"])
            ends.append(meta["request_end_ns"])

    def stat(key, q="p50"):
        return (agg.get(key) or {}).get(q)

    return {
        "served_rps": stat("request_throughput", "avg"),
        "requests": stat("request_count", "avg"),
        "benchmark_duration_s": stat("benchmark_duration", "avg"),
        "ttft_p50_ms": stat("time_to_first_token"), "ttft_p99_ms": stat("time_to_first_token", "p99"),
        "tpot_p50_ms": stat("inter_token_latency"),
        "e2e_p50_ms": stat("request_latency"),
        "output_tokens_per_s": stat("output_token_throughput", "avg"),
        "mean_output_tokens": stat("output_sequence_length", "avg"),
        "first_send_epoch": min(starts) / 1e9 if starts else None,
        "last_answer_epoch": max(ends) / 1e9 if ends else None,
        "errors": (stat("completed_request_count", "avg") or 0) - (stat("request_count", "avg") or 0),
    }
