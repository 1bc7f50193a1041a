"""Helpers for tests: free ports, a real Envoy process, echo upstreams."""
