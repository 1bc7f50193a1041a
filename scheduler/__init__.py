"""The scheduling part: the decision engine between the gateway and the
model servers. `scheduler.epp` is an Endpoint Picker speaking the Gateway API
Inference Extension's protocol over Envoy ext_proc (`mcpctl epp serve`).
Imports only `mesh`."""
