"""Whatever shape a spec has, validation answers with diagnostics, never an exception.

The control plane calls load_config on every change a user saves; a
validator that raised would take the change set (or the server) down
instead of naming the field. Specs are generated from the real field names
of each kind, so the values reach deep into the rules, not just the schema.
"""
import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.validation import validate
from mcp26.mesh.validation.networking_schema import SPECS
from mcp26.mesh.validation.schema import Enum, Map, Obj

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 40, 2 ** 40), st.floats(allow_nan=False),
    st.sampled_from(["", "*", "reviews", "a.example.com", "10.0.0.1", "10.0.0.0/8", "1s", "0s", "5xx",
                     "(", "^/api/.*", "%REQ%", "end-user", "x-mcp-tenant", "unix:///s", "HTTP", "STATIC", "v1"]),
    st.text(max_size=8), st.dates().map(lambda d: datetime.datetime(d.year, d.month, d.day)),
)


def from_schema(schema, depth=0):
    """Values shaped like `schema`, often wrong in type or range."""
    anything = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                            max_leaves=6)
    if depth > 6:
        return SCALARS
    if isinstance(schema, str):
        return SCALARS
    if isinstance(schema, Enum):
        return st.sampled_from(list(schema.values)) | SCALARS
    if isinstance(schema, list):
        return st.lists(from_schema(schema[0], depth + 1), max_size=3) | SCALARS
    if isinstance(schema, Map):
        return st.dictionaries(st.sampled_from(["a", "end-user", "x-mcp-qos-class", "http", ":path", "Host", "k/v"]),
                               from_schema(schema.value, depth + 1), max_size=3)
    fields = (schema.fields if isinstance(schema, Obj) else schema)
    return st.fixed_dictionaries({}, optional={k: from_schema(v, depth + 1) for k, v in fields.items()}) | anything


def check_never_raises(kind, spec):
    res = Resource(api_version="networking.istio.io/v1", kind=kind, name="r", namespace="prod",
                   spec=spec, file="fuzz.yaml", line=1)
    diags = validate(MeshConfig([res]))
    assert all(isinstance(d, Diagnostic) and d.file == "fuzz.yaml" for d in diags)
    assert not any(d.message.startswith("cannot validate") for d in diags), [str(d) for d in diags]


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(from_schema(SPECS["VirtualService"]))
def test_virtual_service(spec):
    check_never_raises("VirtualService", spec)


@FUZZ
@given(from_schema(SPECS["DestinationRule"]))
def test_destination_rule(spec):
    check_never_raises("DestinationRule", spec)


@FUZZ
@given(from_schema(SPECS["Gateway"]))
def test_gateway(spec):
    check_never_raises("Gateway", spec)


@FUZZ
@given(from_schema(SPECS["ServiceEntry"]))
def test_service_entry(spec):
    check_never_raises("ServiceEntry", spec)


@FUZZ
@given(from_schema(SPECS["WorkloadEntry"]))
def test_workload_entry(spec):
    check_never_raises("WorkloadEntry", spec)
