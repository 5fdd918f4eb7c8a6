"""Shared helpers for the acceptance suites live in gpuproof.suite; fixtures in gpuproof.pytest_plugin."""
