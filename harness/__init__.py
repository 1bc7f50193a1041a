"""The checkout's test and benchmark tools, beside the shipped local stack (mcp26.demo.stack):
network namespaces for eBPF, the browser driver, certificates, the Endpoint Picker and decision
loop stacks, perf_analyzer. Not in the wheel: imported from the repository root."""
