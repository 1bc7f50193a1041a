"""Field schemas of networking.istio.io kinds (istio/api networking/v1).

Field names are the CRDs' camelCase JSON names; anything else is an unknown
field, which the Istio CRD schema rejects.
"""
from __future__ import annotations

from mcp26.mesh.validation.schema import Enum, Map, Obj

STRING_MATCH = Obj({"exact": "string", "prefix": "string", "regex": "string"},
                   oneof=(("exact", "prefix", "regex"),))
PERCENT = {"value": "double"}
PORT_SELECTOR = {"number": "uint32"}
DESTINATION = Obj({"host": "string", "subset": "string", "port": PORT_SELECTOR}, required=("host",))
HEADER_OPERATIONS = {"set": Map("string"), "add": Map("string"), "remove": ["string"]}
HEADERS = {"request": HEADER_OPERATIONS, "response": HEADER_OPERATIONS}

HTTP_MATCH_REQUEST = {
    "name": "string", "uri": STRING_MATCH, "scheme": STRING_MATCH, "method": STRING_MATCH,
    "authority": STRING_MATCH, "headers": Map(STRING_MATCH), "port": "uint32",
    "sourceLabels": Map("string"), "gateways": ["string"], "queryParams": Map(STRING_MATCH),
    "ignoreUriCase": "bool", "withoutHeaders": Map(STRING_MATCH), "sourceNamespace": "string",
    "statPrefix": "string",
}
HTTP_ROUTE_DESTINATION = Obj({"destination": DESTINATION, "weight": "int32", "headers": HEADERS},
                             required=("destination",))
HTTP_REDIRECT = Obj({"uri": "string", "authority": "string", "port": "uint32",
                     "derivePort": Enum("FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT"),
                     "scheme": "string", "redirectCode": "uint32"},
                    oneof=(("port", "derivePort"),))
HTTP_DIRECT_RESPONSE = Obj({"status": "uint32",
                            "body": Obj({"string": "string", "bytes": "string"}, oneof=(("string", "bytes"),))},
                           required=("status",))
HTTP_REWRITE = {"uri": "string", "authority": "string",
                "uriRegexRewrite": {"match": "string", "rewrite": "string"}}
HTTP_RETRY = {"attempts": "int32", "perTryTimeout": "duration", "retryOn": "string",
              "retryRemoteLocalities": "bool", "retryIgnorePreviousHosts": "bool",
              "backoff": "duration"}
HTTP_FAULT = {
    "delay": Obj({"fixedDelay": "duration", "exponentialDelay": "duration", "percentage": PERCENT,
                  "percent": "int32"}, oneof=(("fixedDelay", "exponentialDelay"),)),
    "abort": Obj({"httpStatus": "int32", "grpcStatus": "string", "http2Error": "string",
                  "percentage": PERCENT}, oneof=(("httpStatus", "grpcStatus", "http2Error"),)),
}
HTTP_MIRROR = Obj({"destination": DESTINATION, "percentage": PERCENT}, required=("destination",))
CORS_POLICY = {
    "allowOrigin": ["string"], "allowOrigins": [STRING_MATCH], "allowMethods": ["string"],
    "allowHeaders": ["string"], "exposeHeaders": ["string"], "maxAge": "duration",
    "allowCredentials": "bool", "unmatchedPreflights": Enum("UNSPECIFIED", "FORWARD", "IGNORE"),
}
HTTP_ROUTE = {
    "name": "string", "match": [HTTP_MATCH_REQUEST], "route": [HTTP_ROUTE_DESTINATION],
    "redirect": HTTP_REDIRECT, "directResponse": HTTP_DIRECT_RESPONSE,
    "delegate": {"name": "string", "namespace": "string"}, "rewrite": HTTP_REWRITE,
    "timeout": "duration", "retries": HTTP_RETRY, "fault": HTTP_FAULT, "mirror": DESTINATION,
    "mirrors": [HTTP_MIRROR], "mirrorPercent": "uint32", "mirrorPercentage": PERCENT,
    "corsPolicy": CORS_POLICY, "headers": HEADERS,
}
ROUTE_DESTINATION = Obj({"destination": DESTINATION, "weight": "int32"}, required=("destination",))
TLS_ROUTE = {
    "match": [{"sniHosts": ["string"], "destinationSubnets": ["string"], "port": "uint32",
               "sourceLabels": Map("string"), "gateways": ["string"], "sourceNamespace": "string"}],
    "route": [ROUTE_DESTINATION],
}
TCP_ROUTE = {
    "match": [{"destinationSubnets": ["string"], "port": "uint32", "sourceSubnet": "string",
               "sourceLabels": Map("string"), "gateways": ["string"], "sourceNamespace": "string"}],
    "route": [ROUTE_DESTINATION],
}
VIRTUAL_SERVICE = {
    "hosts": ["string"], "gateways": ["string"], "http": [HTTP_ROUTE], "tls": [TLS_ROUTE],
    "tcp": [TCP_ROUTE], "exportTo": ["string"],
}

# --- DestinationRule -------------------------------------------------------
CONSISTENT_HASH = Obj({
    "httpHeaderName": "string",
    "httpCookie": {"name": "string", "path": "string", "ttl": "duration",
                   "attributes": [{"name": "string", "value": "string"}]},
    "useSourceIp": "bool", "httpQueryParameterName": "string",
    "ringHash": {"minimumRingSize": "uint64"}, "maglev": {"tableSize": "uint64"},
    "minimumRingSize": "uint64",
}, oneof=(("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName"),
          ("ringHash", "maglev")))
LOCALITY_LB = {
    "enabled": "bool", "distribute": [{"from": "string", "to": Map("uint32")}],
    "failover": [{"from": "string", "to": "string"}], "failoverPriority": ["string"],
}
LOAD_BALANCER = Obj({
    "simple": Enum("UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN", "LEAST_REQUEST"),
    "consistentHash": CONSISTENT_HASH, "localityLbSetting": LOCALITY_LB,
    "warmupDurationSecs": "duration",
    "warmup": {"duration": "duration", "minimumPercent": "double", "aggression": "double"},
}, oneof=(("simple", "consistentHash"),))
CONNECTION_POOL = {
    "tcp": {"maxConnections": "int32", "connectTimeout": "duration",
            "tcpKeepalive": {"probes": "uint32", "time": "duration", "interval": "duration"},
            "maxConnectionDuration": "duration", "idleTimeout": "duration"},
    "http": {"http1MaxPendingRequests": "int32", "http2MaxRequests": "int32",
             "maxRequestsPerConnection": "int32", "maxRetries": "int32", "idleTimeout": "duration",
             "h2UpgradePolicy": Enum("DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"),
             "useClientProtocol": "bool", "maxConcurrentStreams": "int32",
             "http2KeepAlive": {"interval": "duration", "timeout": "duration"}},
}
OUTLIER_DETECTION = {
    "splitExternalLocalOriginErrors": "bool", "consecutiveLocalOriginFailures": "uint32",
    "consecutiveGatewayErrors": "uint32", "consecutive5xxErrors": "uint32",
    "interval": "duration", "baseEjectionTime": "duration", "maxEjectionPercent": "int32",
    "minHealthPercent": "int32", "consecutiveErrors": "int32",
}
CLIENT_TLS = {
    "mode": Enum("DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"), "clientCertificate": "string",
    "privateKey": "string", "caCertificates": "string", "credentialName": "string",
    "subjectAltNames": ["string"], "sni": "string", "insecureSkipVerify": "bool", "caCrl": "string",
}
PORT_TRAFFIC_POLICY = {"port": PORT_SELECTOR, "loadBalancer": LOAD_BALANCER,
                       "connectionPool": CONNECTION_POOL, "outlierDetection": OUTLIER_DETECTION,
                       "tls": CLIENT_TLS}
TRAFFIC_POLICY = {
    "loadBalancer": LOAD_BALANCER, "connectionPool": CONNECTION_POOL,
    "outlierDetection": OUTLIER_DETECTION, "tls": CLIENT_TLS,
    "portLevelSettings": [PORT_TRAFFIC_POLICY],
    "tunnel": {"protocol": "string", "targetHost": "string", "targetPort": "uint32"},
    "proxyProtocol": {"version": Enum("V1", "V2")},
}
DESTINATION_RULE = Obj({
    "host": "string", "trafficPolicy": TRAFFIC_POLICY,
    "subsets": [Obj({"name": "string", "labels": Map("string"), "trafficPolicy": TRAFFIC_POLICY},
                    required=("name",))],
    "exportTo": ["string"], "workloadSelector": {"matchLabels": Map("string")},
}, required=("host",))

# --- Gateway ---------------------------------------------------------------
SERVER_TLS = {
    "httpsRedirect": "bool",
    "mode": Enum("PASSTHROUGH", "SIMPLE", "MUTUAL", "AUTO_PASSTHROUGH", "ISTIO_MUTUAL", "OPTIONAL_MUTUAL"),
    "serverCertificate": "string", "privateKey": "string", "caCertificates": "string",
    "caCrl": "string", "credentialName": "string", "credentialNames": ["string"],
    "tlsCertificates": [{"serverCertificate": "string", "privateKey": "string", "caCertificates": "string"}],
    "subjectAltNames": ["string"], "verifyCertificateSpki": ["string"],
    "verifyCertificateHash": ["string"],
    "minProtocolVersion": Enum("TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"),
    "maxProtocolVersion": Enum("TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"),
    "cipherSuites": ["string"],
}
GATEWAY_PORT = {"number": "uint32", "protocol": "string", "name": "string", "targetPort": "uint32"}
GATEWAY = {
    "servers": [{"port": GATEWAY_PORT, "bind": "string", "hosts": ["string"], "tls": SERVER_TLS,
                 "defaultEndpoint": "string", "name": "string"}],
    "selector": Map("string"),
}

# --- ServiceEntry / WorkloadEntry -----------------------------------------
WORKLOAD_ENTRY = {
    "address": "string", "ports": Map("uint32"), "labels": Map("string"), "network": "string",
    "locality": "string", "weight": "uint32", "serviceAccount": "string",
}
SERVICE_ENTRY = {
    "hosts": ["string"], "addresses": ["string"],
    "ports": [Obj({"number": "uint32", "protocol": "string", "name": "string", "targetPort": "uint32"},
                  required=("number", "name"))],
    "location": Enum("MESH_EXTERNAL", "MESH_INTERNAL"),
    "resolution": Enum("NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN", "DYNAMIC_DNS"),
    "endpoints": [WORKLOAD_ENTRY], "workloadSelector": {"labels": Map("string")},
    "exportTo": ["string"], "subjectAltNames": ["string"],
}

SPECS = {
    "VirtualService": VIRTUAL_SERVICE,
    "DestinationRule": DESTINATION_RULE,
    "Gateway": GATEWAY,
    "ServiceEntry": SERVICE_ENTRY,
    "WorkloadEntry": WORKLOAD_ENTRY,
}
