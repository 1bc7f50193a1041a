"""The systems benchmarks compare MCP Mesh with, each run as a real server in
its own venv (their dependencies would clash with the product's)."""
