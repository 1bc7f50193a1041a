"""A counter written under another project's exact name, for the dashboards that read it.

Triton (prometheus-cpp) and istiod (OpenTelemetry, WithoutCounterSuffixes) write their
counters without the `_total` suffix: `nv_inference_request_success{model,version}`,
`pilot_xds_pushes{type}`. prometheus_client's text writer appends `_total` to every
counter's name, which would break each dashboard query. These families are written
`untyped` under the name as given: PromQL's rate() and increase() do not read TYPE.
"""
from __future__ import annotations

from prometheus_client.core import Metric


def exact_counter(name: str, documentation: str, samples) -> Metric:
    """A family `name` whose samples ({label: value}, value) are written as `name{labels} value`."""
    family = Metric(name, documentation, "untyped")
    for labels, value in samples:
        family.add_sample(name, labels, value)
    return family
