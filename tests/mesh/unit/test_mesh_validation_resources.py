"""DestinationRule, Gateway, ServiceEntry and WorkloadEntry validation (Istio's rules).

Each case's offending line carries `#<`; load_texts must raise, naming
file, that line, the resource and the field.
"""
import pytest

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.change_set import load_texts


def marker_line(text: str) -> int:
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if "#<" in line]
    assert len(lines) == 1
    return lines[0]


def doc(kind: str, spec: str, name: str = "r", namespace: str = "prod",
        api: str = "networking.istio.io/v1") -> str:
    # A case without a marked line is about a missing field: Istio names the
    # field, and the line is its parent's (spec:).
    mark = "" if "#<" in spec or "#<" in name else "  #<"
    return f"apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:{mark}\n{spec}"


def rejected(text: str, resource: str, field: str, message: str):
    with pytest.raises(ConfigError) as exc:
        load_texts({"mesh.yaml": text})
    hits = [d for d in exc.value.diagnostics if d.field == field and message in d.message]
    assert hits, f"no {field!r} ~ {message!r} in:\n" + "\n".join(map(str, exc.value.diagnostics))
    assert (hits[0].file, hits[0].line, hits[0].resource) == ("mesh.yaml", marker_line(text), resource)


DR = "DestinationRule/prod/r"
DR_CASES = {
    "duplicate subset names": ("""  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v1, labels: {version: v2}}  #<
""", "spec.subsets[1].name", "duplicate subset names: v1"),
    "subset needs a name": ("""  host: reviews
  subsets:
  - labels: {version: v1}  #<
""", "spec.subsets[0].name", "name is required"),
    "subset label value invalid": ("""  host: reviews
  subsets:
  - name: v1
    labels: {version: "v 1"}  #<
""", "spec.subsets[0].labels.version", "invalid tag value 'v 1'"),
    "host invalid": ("""  host: "reviews..bookinfo"  #<
""", "spec.host", "invalid (label '' invalid)"),
    "host required": ("""  subsets: []
""", "spec.host", "host is required"),
    "simple lb unknown": ("""  host: reviews
  trafficPolicy:
    loadBalancer: {simple: FASTEST}  #<
""", "spec.trafficPolicy.loadBalancer.simple", "unsupported value 'FASTEST'"),
    "simple and consistentHash": ("""  host: reviews
  trafficPolicy:
    loadBalancer:
      simple: ROUND_ROBIN
      consistentHash: {httpHeaderName: x-user}  #<
""", "spec.trafficPolicy.loadBalancer.consistentHash", "only one of simple, consistentHash may be set"),
    "consistentHash header invalid": ("""  host: reviews
  trafficPolicy:
    loadBalancer:
      consistentHash: {httpHeaderName: "x user"}  #<
""", "spec.trafficPolicy.loadBalancer.consistentHash.httpHeaderName", "is not a valid header name"),
    "consistentHash cookie without name": ("""  host: reviews
  trafficPolicy:
    loadBalancer:
      consistentHash:
        httpCookie: {ttl: 10s}  #<
""", "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.name", "name required for HttpCookie"),
    "maglev table not prime": ("""  host: reviews
  trafficPolicy:
    loadBalancer:
      consistentHash:
        httpHeaderName: x-user
        maglev: {tableSize: 65536}  #<
""", "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize", "tableSize must be a prime number for maglev"),
    "connectionPool negative": ("""  host: reviews
  trafficPolicy:
    connectionPool:
      http: {http2MaxRequests: -1}  #<
""", "spec.trafficPolicy.connectionPool.http.http2MaxRequests", "http2 max requests must be non-negative"),
    "connectionPool empty": ("""  host: reviews
  trafficPolicy:
    connectionPool: {}  #<
""", "spec.trafficPolicy.connectionPool", "connection pool must have at least one field"),
    "connect timeout under 1ms": ("""  host: reviews
  trafficPolicy:
    connectionPool:
      tcp: {connectTimeout: 100us}  #<
""", "spec.trafficPolicy.connectionPool.tcp.connectTimeout", "duration must be greater than 1ms"),
    "upgrade and client protocol": ("""  host: reviews
  trafficPolicy:
    connectionPool:
      http: {h2UpgradePolicy: UPGRADE, useClientProtocol: true}  #<
""", "spec.trafficPolicy.connectionPool.http.useClientProtocol", "use client protocol must not be true"),
    "outlier ejection percent": ("""  host: reviews
  trafficPolicy:
    outlierDetection:
      consecutive5xxErrors: 5
      maxEjectionPercent: 101  #<
""", "spec.trafficPolicy.outlierDetection.maxEjectionPercent", "percentage 101 is not in range 0..100"),
    "outlier interval": ("""  host: reviews
  trafficPolicy:
    outlierDetection:
      interval: 10  #<
""", "spec.trafficPolicy.outlierDetection.interval", "must be a duration string"),
    "outlier local origin without split": ("""  host: reviews
  trafficPolicy:
    outlierDetection:
      consecutiveLocalOriginFailures: 3  #<
""", "spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures", "split external local origin errors is set to false"),
    "empty traffic policy": ("""  host: reviews
  trafficPolicy: {}  #<
""", "spec.trafficPolicy", "traffic policy must have at least one field"),
    "subset traffic policy checked too": ("""  host: reviews
  subsets:
  - name: v1
    labels: {version: v1}
    trafficPolicy:
      connectionPool:
        tcp: {maxConnections: -5}  #<
""", "spec.subsets[0].trafficPolicy.connectionPool.tcp.maxConnections", "max connections must be non-negative"),
    "client tls mutual without cert": ("""  host: reviews
  trafficPolicy:
    tls: {mode: MUTUAL, privateKey: /k.pem}  #<
""", "spec.trafficPolicy.tls.clientCertificate", "client certificate required for mutual tls"),
    "locality weights": ("""  host: reviews
  trafficPolicy:
    loadBalancer:
      localityLbSetting:
        distribute:
        - from: us-west/*
          to: {"us-west/*": 60, "us-east/*": 30}  #<
""", "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to", "total locality weight 90 != 100"),
    "unknown field": ("""  host: reviews
  trafficPolicy:
    circuitBreaker: {maxConnections: 5}  #<
""", "spec.trafficPolicy.circuitBreaker", "unknown field 'circuitBreaker'"),
    "exportTo invalid": ("""  host: reviews
  exportTo: [".", "Bad_NS"]  #<
""", "spec.exportTo[1]", "only . or * or a valid DNS-1123 label"),
}

GW = "Gateway/prod/r"
GW_CASES = {
    "no servers": ("""  selector: {istio: ingressgateway}
  servers: []  #<
""", "spec.servers", "gateway must have at least one server"),
    "port out of range": ("""  servers:
  - port: {number: 0, name: http, protocol: HTTP}  #<
    hosts: ["*.example.com"]
""", "spec.servers[0].port.number", "port number 0 must be in the range 1..65535"),
    "protocol unknown": ("""  servers:
  - port: {number: 80, name: http, protocol: HTTP3000}  #<
    hosts: ["*.example.com"]
""", "spec.servers[0].port.protocol", "invalid protocol 'HTTP3000'"),
    "port name missing": ("""  servers:
  - port: {number: 80, protocol: HTTP}  #<
    hosts: ["*.example.com"]
""", "spec.servers[0].port.name", "port name must be set"),
    "port names unique": ("""  servers:
  - port: {number: 80, name: web, protocol: HTTP}
    hosts: ["a.example.com"]
  - port: {number: 8080, name: web, protocol: HTTP}  #<
    hosts: ["b.example.com"]
""", "spec.servers[1].port.name", "port names in servers must be unique: duplicate name web"),
    "short host": ("""  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [reviews]  #<
""", "spec.servers[0].hosts[0]", "short names (non FQDN) are not allowed"),
    "bad namespace in host": ("""  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["Bad_NS/a.example.com"]  #<
""", "spec.servers[0].hosts[0]", "invalid namespace value 'Bad_NS' in gateway"),
    "partial wildcard": ("""  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["prod/a*.example.com"]  #<
""", "spec.servers[0].hosts[0]", "invalid (label 'a*' invalid)"),
    "no hosts": ("""  servers:
  - port: {number: 80, name: http, protocol: HTTP}  #<
""", "spec.servers[0].hosts", "server config must contain at least one host"),
    "https without tls": ("""  servers:
  - port: {number: 443, name: https, protocol: HTTPS}  #<
    hosts: ["a.example.com"]
""", "spec.servers[0].tls", "server must have TLS settings for HTTPS/TLS protocols"),
    "simple tls needs certificate": ("""  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["a.example.com"]
    tls: {mode: SIMPLE, privateKey: /etc/key.pem}  #<
""", "spec.servers[0].tls.serverCertificate", "SIMPLE TLS requires a server certificate"),
    "istio mutual with certificate": ("""  servers:
  - port: {number: 443, name: tls, protocol: TLS}
    hosts: ["a.example.com"]
    tls:
      mode: ISTIO_MUTUAL
      credentialName: cert  #<
""", "spec.servers[0].tls.credentialName", "ISTIO_MUTUAL TLS cannot have associated credentialName"),
    "tls mode unknown": ("""  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["a.example.com"]
    tls: {mode: STRICT}  #<
""", "spec.servers[0].tls.mode", "unsupported value 'STRICT'"),
    "tls on tcp port": ("""  servers:
  - port: {number: 9000, name: tcp, protocol: TCP}
    hosts: ["a.example.com"]
    tls: {mode: SIMPLE, credentialName: c}  #<
""", "spec.servers[0].tls", "server cannot have TLS settings for non HTTPS/TLS ports"),
    "bind not an ip": ("""  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    bind: localhost  #<
    hosts: ["a.example.com"]
""", "spec.servers[0].bind", "localhost is not a valid IP"),
    "gateway name with dots": (None, "metadata.name", "invalid gateway name: 'my.gw'"),
}

SE = "ServiceEntry/prod/r"
SE_CASES = {
    "no hosts": ("""  hosts: []  #<
  ports: [{number: 80, name: http, protocol: HTTP}]
""", "spec.hosts", "service entry must have at least one host"),
    "wildcard host": ("""  hosts: ["*"]  #<
  ports: [{number: 80, name: http, protocol: HTTP}]
""", "spec.hosts[0]", "invalid host *"),
    "duplicate port number": ("""  hosts: [api.example.com]
  ports:
  - {number: 80, name: http, protocol: HTTP}
  - {number: 80, name: http-alt, protocol: HTTP}  #<
""", "spec.ports[1].number", "service entry port 80 already defined"),
    "duplicate port name": ("""  hosts: [api.example.com]
  ports:
  - {number: 80, name: http, protocol: HTTP}
  - {number: 81, name: http, protocol: HTTP}  #<
""", "spec.ports[1].name", "service entry port name 'http' already defined"),
    "port protocol": ("""  hosts: [api.example.com]
  ports:
  - {number: 80, name: http, protocol: QUIC}  #<
""", "spec.ports[0].protocol", "unsupported protocol: QUIC"),
    "resolution unknown": ("""  hosts: [api.example.com]
  resolution: DNS_ALL  #<
""", "spec.resolution", "unsupported value 'DNS_ALL'"),
    "location unknown": ("""  hosts: [api.example.com]
  location: OUTSIDE  #<
""", "spec.location", "unsupported value 'OUTSIDE'"),
    "static endpoint not an ip": ("""  hosts: [api.example.com]
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints:
  - address: backend.example.com  #<
""", "spec.endpoints[0].address", "endpoint address 'backend.example.com' is not a valid IP address"),
    "endpoint port not a service port": ("""  hosts: [api.example.com]
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints:
  - address: 10.0.0.1
    ports: {grpc: 9090}  #<
""", "spec.endpoints[0].ports.grpc", "endpoint port 9090 is not defined by the service entry"),
    "endpoint labels invalid": ("""  hosts: [api.example.com]
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints:
  - address: 10.0.0.1
    labels: {"bad key!": v1}  #<
""", "spec.endpoints[0].labels.bad key!", "invalid tag key"),
    "dns without fqdn": ("""  hosts: ["*.example.com"]  #<
  resolution: DNS
  ports: [{number: 443, name: tls, protocol: TLS}]
""", "spec.hosts[0]", "hosts must be FQDN if no endpoints are provided for resolution mode DNS"),
    "dns round robin endpoints": ("""  hosts: [api.example.com]
  resolution: DNS_ROUND_ROBIN
  ports: [{number: 443, name: tls, protocol: TLS}]
  endpoints:  #<
  - address: a.example.com
  - address: b.example.com
""", "spec.endpoints", "there must only be 0 or 1 endpoint for resolution mode DNS_ROUND_ROBIN"),
    "none with endpoints": ("""  hosts: [api.example.com]
  resolution: NONE
  endpoints:  #<
  - address: 10.0.0.1
""", "spec.endpoints", "no endpoints should be provided for resolution type none"),
    "selector and endpoints": ("""  hosts: [api.example.com]
  resolution: STATIC
  workloadSelector:  #<
    labels: {app: api}
  endpoints:
  - address: 10.0.0.1
""", "spec.workloadSelector", "only one of WorkloadSelector or Endpoints is allowed in Service Entry"),
    "cidr with dns": ("""  hosts: [api.example.com]
  addresses: [10.0.0.0/24]  #<
  resolution: DNS
""", "spec.addresses", "CIDR addresses are allowed only for NONE/STATIC resolution types"),
    "address invalid": ("""  hosts: [api.example.com]
  addresses: [10.0.0.300]  #<
""", "spec.addresses[0]", "10.0.0.300 is not a valid IP"),
    "multiple hosts tcp": ("""  hosts: [a.example.com, b.example.com]
  resolution: DNS
  ports:
  - {number: 5432, name: pg, protocol: TCP}  #<
""", "spec.ports[0].protocol", "multiple hosts provided with non-HTTP, non-TLS ports"),
}

WE = "WorkloadEntry/prod/r"
WE_CASES = {
    "address required": ("""  labels: {app: api}
""", "spec.address", "address is required"),
    "address invalid": ("""  address: "10.0.0.1 "  #<
""", "spec.address", "is not a valid FQDN or an IP address"),
    "port out of range": ("""  address: 10.0.0.1
  ports: {http: 70000}  #<
""", "spec.ports.http", "port number 70000 must be in the range 1..65535"),
    "unix address relative": ("""  address: unix://var/run/sock  #<
""", "spec.address", "is not an absolute path to a file"),
    "unknown field": ("""  address: 10.0.0.1
  port: 80  #<
""", "spec.port", "unknown field 'port' (did you mean 'ports'?)"),
}


@pytest.mark.parametrize("case", sorted(DR_CASES))
def test_destination_rule(case):
    spec, field, message = DR_CASES[case]
    rejected(doc("DestinationRule", spec), DR, field, message)


@pytest.mark.parametrize("case", sorted(GW_CASES))
def test_gateway(case):
    spec, field, message = GW_CASES[case]
    if spec is None:
        text = doc("Gateway", "  servers:\n  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: ['*']\n",
                   name="my.gw  #<")
        with pytest.raises(ConfigError) as exc:
            load_texts({"mesh.yaml": text})
        d = next(d for d in exc.value.diagnostics if d.field == field)
        assert message in d.message and d.line == marker_line(text)
        return
    rejected(doc("Gateway", spec), GW, field, message)


@pytest.mark.parametrize("case", sorted(SE_CASES))
def test_service_entry(case):
    spec, field, message = SE_CASES[case]
    rejected(doc("ServiceEntry", spec), SE, field, message)


@pytest.mark.parametrize("case", sorted(WE_CASES))
def test_workload_entry(case):
    spec, field, message = WE_CASES[case]
    rejected(doc("WorkloadEntry", spec), WE, field, message)


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha3"])
def test_every_served_version_is_accepted(version):
    text = doc("ServiceEntry", "  hosts: [api.example.com]\n  resolution: DNS\n  ports: [{number: 443, name: tls, protocol: TLS}]\n",
               api=f"networking.istio.io/{version}")
    assert len(load_texts({"se.yaml": text})) == 1


def test_wrong_api_group_for_a_kind():
    text = doc("DestinationRule", "  host: reviews\n", api="security.istio.io/v1  #<").replace("spec:  #<", "spec:")
    rejected(text, DR, "apiVersion", "DestinationRule is not served at 'security.istio.io/v1'")


def test_valid_resources_of_every_kind_load_clean():
    text = "---\n".join([
        doc("Gateway", """  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["prod/*.example.com"]
    tls: {mode: SIMPLE, credentialName: wildcard-cert}
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*/api.example.com"]
    tls: {httpsRedirect: true}
""", name="gw"),
        doc("DestinationRule", """  host: api.example.com
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: x-mcp-tenant, maglev: {tableSize: 65537}}}
    connectionPool:
      tcp: {maxConnections: 100, connectTimeout: 250ms}
      http: {http2MaxRequests: 1000, maxRetries: 2, idleTimeout: 1h}
    outlierDetection: {consecutive5xxErrors: 3, interval: 5s, baseEjectionTime: 30s, maxEjectionPercent: 100}
  subsets:
  - {name: blue, labels: {color: blue}}
""", name="api"),
        doc("ServiceEntry", """  hosts: [api.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP, targetPort: 18080}]
  endpoints:
  - {address: 127.0.0.1, labels: {color: blue}, ports: {http: 18081}, weight: 3}
  - {address: "::1", labels: {color: blue}}
""", name="api"),
        doc("WorkloadEntry", "  address: 10.0.0.7\n  labels: {app: api}\n  ports: {http: 8080}\n", name="we"),
    ])
    config = load_texts({"ok.yaml": text})
    assert sorted(r.kind for r in config) == ["DestinationRule", "Gateway", "ServiceEntry", "WorkloadEntry"]
    assert [d for d in config.warnings if d.severity == "warning"] == []


def test_a_misspelt_spec_key_is_not_silently_an_empty_spec():
    text = doc("WorkloadEntry", "").replace("spec:  #<\n", "specs:  #<\n  address: 10.0.0.1\n")
    rejected(text, WE, "specs", "unknown field 'specs' at the top level of a WorkloadEntry (did you mean 'spec'?)")


def test_object_names_must_be_kubernetes_names():
    text = doc("WorkloadEntry", "  address: 10.0.0.1\n", name="Reviews_V1  #<")
    with pytest.raises(ConfigError) as exc:
        load_texts({"mesh.yaml": text})
    [d] = exc.value.diagnostics
    assert (d.field, d.line) == ("metadata.name", marker_line(text)) and "DNS-1123 subdomain" in d.message


def test_subset_without_labels_warns():
    config = load_texts({"dr.yaml": doc("DestinationRule", "  host: reviews\n  subsets:\n  - name: all\n")})
    [w] = [d for d in config.warnings if d.field == "spec.subsets[0].labels"]
    assert w.severity == "warning" and "selects every endpoint of reviews" in w.message


def test_old_tls_version_without_ciphers_warns():
    spec = """  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["a.example.com"]
    tls: {mode: SIMPLE, credentialName: c, minProtocolVersion: TLSV1_0}
"""
    config = load_texts({"gw.yaml": doc("Gateway", spec)})
    [w] = config.warnings
    assert (w.severity, w.field) == ("warning", "spec.servers[0].tls.minProtocolVersion")
