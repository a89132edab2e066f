"""The documented example and the benchmark script run (small sizes) against the cluster."""

import os
import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]


def run_script(meta, script, *args):
    env = dict(os.environ, FLOTILLA_META=meta)
    result = subprocess.run(
        [sys.executable, str(PYTHON_DIR / script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_block_cyclic_example(meta):
    out = run_script(meta, "examples/block_cyclic.py", "--n", "512", "--block", "32", "--path", "/example_bc.f64")
    assert "OK" in out


def test_column_block_benchmark_runs(meta):
    out = run_script(meta, "benchmarks/column_block.py", "--n", "256", "--columns", "16", "--repeat", "1")
    assert "one read_into vs per-row loop" in out
