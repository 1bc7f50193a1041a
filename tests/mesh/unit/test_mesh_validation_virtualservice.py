"""VirtualService validation: Istio's rules, each bad input rejected with file, line, resource, field.

Each case is a YAML text whose offending line carries the marker `#<`; the
test asserts load_texts raised, and that one diagnostic names the file, that
line, the resource and the field path, with Istio's message.
"""
import pytest

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.change_set import load_texts

HEAD = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
  namespace: bookinfo
spec:
"""
SUPPORT = """---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
"""


def marker_line(text: str) -> int:
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if "#<" in line]
    assert len(lines) == 1, "a case marks exactly one line"
    return lines[0]


def rejected(body: str, field: str, message: str, resource: str = "VirtualService/bookinfo/reviews",
             head: str | None = None):
    text = (head or HEAD) + body + SUPPORT
    with pytest.raises(ConfigError) as exc:
        load_texts({"vs.yaml": text})
    diags = exc.value.diagnostics
    hits = [d for d in diags if d.field == field and message in d.message]
    assert hits, f"no {field!r} ~ {message!r} in:\n" + "\n".join(map(str, diags))
    d = hits[0]
    assert (d.file, d.line, d.resource, d.severity) == ("vs.yaml", marker_line(text), resource, "error")
    # The rendered line is what the CLI prints: file:line: error: Kind/ns/name: field: message
    assert str(d).startswith(f"vs.yaml:{d.line}: error: {resource}: {field}: ")
    return diags


CASES = {
    "invalid uri regex": ("""  hosts: [reviews]
  http:
  - match:
    - uri: {regex: "(unclosed"}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].uri.regex", "missing ): (unclosed"),
    # RE2 has no look-ahead: Python's re would accept this, Envoy would NACK it.
    "lookahead is not RE2": ("""  hosts: [reviews]
  http:
  - match:
    - headers:
        x-model:
          regex: "^(?=llama).*"  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].headers.x-model.regex", "invalid perl operator"),
    "invalid query param regex": ("""  hosts: [reviews]
  http:
  - match:
    - queryParams:
        v: {regex: "[a-"}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].queryParams.v.regex", "missing ]"),
    "withoutHeaders bad name": ("""  hosts: [reviews]
  http:
  - match:
    - withoutHeaders:
        "bad header": {exact: x}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].withoutHeaders.bad header", "is not a valid header name"),
    "regex too long": ("""  hosts: [reviews]
  http:
  - match:
    - authority: {regex: "%s"}  #<
    route:
    - destination: {host: reviews}
""" % ("a" * 1025), "spec.http[0].match[0].authority.regex", "regex is too large, max length allowed is 1024"),
    "regex over Envoy's program size": ("""  hosts: [reviews]
  http:
  - match:
    - uri: {regex: "^/(a|b){60}$"}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].uri.regex", "over the 100 Envoy accepts (re2.max_program_size.error_level)"),
    "two string match kinds": ("""  hosts: [reviews]
  http:
  - match:
    - method: {exact: GET, prefix: G}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].method.prefix", "only one of exact, prefix, regex may be set"),
    "negative weight": ("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      weight: -10  #<
    - destination: {host: reviews, subset: v2}
      weight: 110
""", "spec.http[0].route[0].weight", "weight -10 < 0"),
    "weight beyond int32": ("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      weight: 4294967296  #<
""", "spec.http[0].route[0].weight", "out of range"),
    "total weight zero": ("""  hosts: [reviews]
  http:
  - route:  #<
    - destination: {host: reviews, subset: v1}
      weight: 0
    - destination: {host: reviews, subset: v2}
      weight: 0
""", "spec.http[0].route", "total destination weight = 0"),
    "duplicate hosts": ("""  hosts:
  - reviews
  - "*.bookinfo.svc.cluster.local"
  - reviews.bookinfo.svc.cluster.local  #<
  http:
  - route:
    - destination: {host: reviews}
""", "spec.hosts[2]", "duplicate hosts in virtual service: *.bookinfo.svc.cluster.local & reviews.bookinfo.svc.cluster.local"),
    "wildcard host on mesh": ("""  hosts: ["*"]  #<
  http:
  - route:
    - destination: {host: reviews}
""", "spec.hosts[0]", "wildcard host * is not allowed for virtual services bound to the mesh gateway"),
    "bad host": ("""  hosts: [rev_iews]  #<
  http:
  - route:
    - destination: {host: reviews}
""", "spec.hosts[0]", "domain name 'rev_iews' invalid"),
    "route and redirect": ("""  hosts: [reviews]
  http:
  - redirect: {uri: /v2}
    route:  #<
    - destination: {host: reviews}
""", "spec.http[0].route", "HTTP route cannot contain both route and redirect"),
    "route and directResponse": ("""  hosts: [reviews]
  http:
  - directResponse: {status: 503}
    route:  #<
    - destination: {host: reviews}
""", "spec.http[0].route", "HTTP route cannot contain both route and direct_response"),
    "redirect and directResponse": ("""  hosts: [reviews]
  http:
  - redirect: {uri: /v2}
    directResponse: {status: 503}  #<
""", "spec.http[0].directResponse", "cannot contain both direct_response and redirect"),
    "nothing to do": ("""  hosts: [reviews]
  http:
  - name: empty  #<
    match:
    - uri: {prefix: /}
""", "spec.http[0].route", "HTTP route, redirect or direct_response is required"),
    "rewrite with redirect": ("""  hosts: [reviews]
  http:
  - redirect: {uri: /v2}
    rewrite: {uri: /v3}  #<
""", "spec.http[0].rewrite", "HTTP route rule cannot contain both rewrite and redirect"),
    "rewrite uri and regex": ("""  hosts: [reviews]
  http:
  - rewrite:  #<
      uri: /a
      uriRegexRewrite: {match: "^/b", rewrite: /c}
    route:
    - destination: {host: reviews}
""", "spec.http[0].rewrite", "rewrite may only contain one of URI or UriRegexRewrite"),
    "rewrite regex invalid": ("""  hosts: [reviews]
  http:
  - rewrite:
      uriRegexRewrite: {match: "^/(b", rewrite: /c}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].rewrite.uriRegexRewrite.match", "UriRegexRewrite has errors"),
    "timeout under 1ms": ("""  hosts: [reviews]
  http:
  - timeout: 500us  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].timeout", "duration must be greater than 1ms"),
    "timeout sub-ms precision": ("""  hosts: [reviews]
  http:
  - timeout: 1.0005s  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].timeout", "only durations to ms precision are supported"),
    "timeout not a duration": ("""  hosts: [reviews]
  http:
  - timeout: 5 seconds  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].timeout", "invalid duration '5 seconds'"),
    "retries negative": ("""  hosts: [reviews]
  http:
  - retries:
      attempts: -1  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].retries.attempts", "attempts cannot be negative"),
    "retries without attempts": ("""  hosts: [reviews]
  http:
  - retries:  #<
      retryOn: 5xx
    route:
    - destination: {host: reviews}
""", "spec.http[0].retries.attempts", "http retry policy configured when attempts are set to 0 (disabled)"),
    "retryOn unknown": ("""  hosts: [reviews]
  http:
  - retries:
      attempts: 2
      retryOn: 5xx,sometimes  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].retries.retryOn", "'sometimes' is not a valid retryOn policy"),
    "fault percentage over 100": ("""  hosts: [reviews]
  http:
  - fault:
      delay:
        fixedDelay: 5s
        percentage:
          value: 101  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].fault.delay.percentage.value", "percentage 101 is neither 0.0, nor in range [0.0001, 100.0]"),
    "fault percentage negative": ("""  hosts: [reviews]
  http:
  - fault:
      abort:
        httpStatus: 503
        percentage: {value: -1}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].fault.abort.percentage.value", "is neither 0.0, nor in range"),
    "fault abort status": ("""  hosts: [reviews]
  http:
  - fault:
      abort:
        httpStatus: 99  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].fault.abort.httpStatus", "HTTP status 99 is not in range 200-599"),
    "fault grpc status": ("""  hosts: [reviews]
  http:
  - fault:
      abort:
        grpcStatus: TEAPOT  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].fault.abort.grpcStatus", "gRPC status 'TEAPOT' is not supported"),
    "fault empty": ("""  hosts: [reviews]
  http:
  - fault: {}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].fault", "HTTP fault injection must have an abort and/or a delay"),
    "fault with redirect": ("""  hosts: [reviews]
  http:
  - redirect: {uri: /x}
    fault: {delay: {fixedDelay: 1s}}  #<
""", "spec.http[0].fault", "HTTP route cannot contain both fault and redirect"),
    "mirrorPercentage over 100": ("""  hosts: [reviews]
  http:
  - mirror: {host: reviews, subset: v2}
    mirrorPercentage:
      value: 100.5  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].mirrorPercentage.value", "mirror_percentage must have a max value of 100"),
    "mirror and mirrors": ("""  hosts: [reviews]
  http:
  - mirror: {host: reviews}
    mirrors:  #<
    - destination: {host: reviews, subset: v2}
    route:
    - destination: {host: reviews}
""", "spec.http[0].mirrors", "HTTP route cannot contain both mirror and mirrors"),
    "header op on host": ("""  hosts: [reviews]
  http:
  - headers:
      response:
        set:
          host: evil  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].headers.response.set.host", 'invalid header "host": cannot set Host header'),
    "header op pseudo header": ("""  hosts: [reviews]
  http:
  - headers:
      request:
        remove: [":path"]  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].headers.request.remove[0]", 'header cannot have ":" prefix'),
    "header value control character": ("""  hosts: [reviews]
  http:
  - headers:
      request:
        add:
          x-a: "one\\ntwo"  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].headers.request.add.x-a", "is invalid"),
    "header value lone percent": ("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
      headers:
        request:
          set:
            x-share: "50%"  #<
""", "spec.http[0].route[0].headers.request.set.x-share", "has a '%' that starts no %COMMAND%"),
    "header value unknown envoy command": ("""  hosts: [reviews]
  http:
  - headers:
      response:
        set:
          x-served: "%SERVED_BY%"  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].headers.response.set.x-served", "Envoy has no command %SERVED_BY%"),
    "header value command without its argument": ("""  hosts: [reviews]
  http:
  - headers:
      request:
        add:
          x-user: "%REQ%"  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].headers.request.add.x-user", "%REQ% needs an argument"),
    "authority set twice": ("""  hosts: [reviews]
  http:
  - rewrite: {authority: a.example.com}
    headers:
      request:
        set:
          ":authority": b.example.com  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].headers.request.set.:authority", "authority header cannot be set multiple times"),
    "cors bad method": ("""  hosts: [reviews]
  http:
  - corsPolicy:
      allowOrigins: [{exact: "https://a.example.com"}]
      allowMethods: [GET, FETCH]  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].corsPolicy.allowMethods[1]", "'FETCH' is not a supported HTTP method"),
    "cors empty origin": ("""  hosts: [reviews]
  http:
  - corsPolicy:
      allowOrigins:
      - {exact: ""}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].corsPolicy.allowOrigins[0]", "is not a valid match type for CORS allow origins"),
    "cors bad origin regex": ("""  hosts: [reviews]
  http:
  - corsPolicy:
      allowOrigins:
      - {regex: "https://(a"}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].corsPolicy.allowOrigins[0].regex", "corsPolicy.allowOrigins"),
    "cors maxAge sub-second": ("""  hosts: [reviews]
  http:
  - corsPolicy:
      maxAge: 1500ms  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].corsPolicy.maxAge", "max_age duration is accurate only to seconds precision"),
    "redirect code": ("""  hosts: [reviews]
  http:
  - redirect:
      uri: /v2
      redirectCode: 200  #<
""", "spec.http[0].redirect.redirectCode", "200 is not a valid redirect code, must be 3xx"),
    "redirect scheme": ("""  hosts: [reviews]
  http:
  - redirect:
      scheme: ftp  #<
""", "spec.http[0].redirect.scheme", 'invalid redirect scheme, must be "http" or "https"'),
    "redirect port and derivePort": ("""  hosts: [reviews]
  http:
  - redirect:
      port: 8443
      derivePort: FROM_REQUEST_PORT  #<
""", "spec.http[0].redirect.derivePort", "only one of port, derivePort may be set"),
    "directResponse status": ("""  hosts: [reviews]
  http:
  - directResponse:
      status: 700  #<
""", "spec.http[0].directResponse.status", "HTTP status 700 is not in range 200-599"),
    "destination host wildcard": ("""  hosts: [reviews]
  http:
  - route:
    - destination:
        host: "*"  #<
""", "spec.http[0].route[0].destination.host", "invalid destination host *"),
    "destination without host": ("""  hosts: [reviews]
  http:
  - route:
    - destination:  #<
        subset: v1
""", "spec.http[0].route[0].destination.host", "host is required"),
    "destination port": ("""  hosts: [reviews]
  http:
  - route:
    - destination:
        host: reviews
        port: {number: 0}  #<
""", "spec.http[0].route[0].destination.port.number", "port number 0 must be in the range 1..65535"),
    "subset name invalid": ("""  hosts: [reviews]
  http:
  - route:
    - destination:
        host: reviews
        subset: V_1  #<
""", "spec.http[0].route[0].destination.subset", "subset name is invalid: V_1"),
    "unknown field": ("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
    timeOut: 5s  #<
""", "spec.http[0].timeOut", "unknown field 'timeOut' (did you mean 'timeout'?)"),
    "snake_case field": ("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
    mirror_percentage: {value: 5}  #<
""", "spec.http[0].mirror_percentage", "did you mean 'mirrorPercentage'?"),
    "wrong type": ("""  hosts: reviews  #<
  http:
  - route:
    - destination: {host: reviews}
""", "spec.hosts", "must be a list, got str"),
    "no routes at all": ("""  hosts: [reviews]
""", "spec", "http, tcp or tls must be provided in virtual service", "spec:"),
    "gateway name invalid": ("""  hosts: [reviews.example.com]
  gateways: ["bookinfo/Bad_Gw"]  #<
  http:
  - route:
    - destination: {host: reviews}
""", "spec.gateways[0]", "invalid value for gateway name: 'Bad_Gw'"),
    "jwt claim routing needs a gateway": ("""  hosts: [reviews]
  http:
  - match:
    - headers:
        "@request.auth.claims.group": {exact: admin}  #<
    route:
    - destination: {host: reviews}
""", "spec.http[0].match[0].headers.@request.auth.claims.group", "JWT claim based routing"),
    "tcp route missing": ("""  hosts: [reviews]
  tcp:
  - match:  #<
    - port: 9000
""", "spec.tcp[0].route", "TCP route is required"),
    "tls sni not in hosts": ("""  hosts: [reviews.example.com]
  gateways: [bookinfo/gw]
  tls:
  - match:
    - sniHosts: [other.example.com]  #<
    route:
    - destination: {host: reviews}
""", "spec.tls[0].match[0].sniHosts[0]", "is not a compatible subset of any of the virtual service hosts"),
    "delegate with gateways": ("""  gateways: [bookinfo/gw]  #<
  http:
  - route:
    - destination: {host: reviews}
""", "spec.gateways", "delegate virtual service must have no gateways specified"),
    "wrong apiVersion": ("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
""", "apiVersion", "VirtualService is not served at 'networking.istio.io/v2'", "apiVersion: networking.istio.io/v1\n"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_virtual_service_is_rejected_naming_the_field(case):
    body, field, message, *head_line = CASES[case]
    head = None
    if head_line:  # the offending line is in the header: mark it there
        line = head_line[0]
        if line == "apiVersion: networking.istio.io/v1\n":
            head = HEAD.replace(line, "apiVersion: networking.istio.io/v2  #<\n", 1)
        else:
            head = HEAD.replace(line, line + "  #<", 1)
    rejected(body, field, message, head=head)


@pytest.mark.parametrize("header", ["end-user", "x-mcp-tenant", "x-mcp-session-sig", "x-mcp-qos-class",
                                    "End-User"])
@pytest.mark.parametrize("op", ["set", "add", "remove"])
def test_session_headers_may_be_matched_but_never_changed(header, op):
    value = f'["{header}"]' if op == "remove" else f'{{"{header}": forged}}'
    body = f"""  hosts: [reviews]
  http:
  - match:
    - headers:
        end-user: {{exact: jason}}
    headers:
      request:
        {op}: {value}  #<
    route:
    - destination: {{host: reviews, subset: v2}}
"""
    field = (f"spec.http[0].headers.request.remove[0]" if op == "remove"
             else f"spec.http[0].headers.request.{op}.{header}")
    rejected(body, field, f"may not {op} it")


def test_session_header_rule_covers_per_destination_headers_too():
    rejected("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      headers:
        request:
          set: {x-mcp-qos-class: latency-critical}  #<
""", "spec.http[0].route[0].headers.request.set.x-mcp-qos-class", "mesh session/QoS header")


def test_every_error_of_a_resource_is_reported_at_once():
    diags = rejected("""  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      weight: -1  #<
    timeout: 0s
    retries: {attempts: -2}
""", "spec.http[0].route[0].weight", "weight -1 < 0")
    fields = {d.field for d in diags}
    assert {"spec.http[0].timeout", "spec.http[0].retries.attempts"} <= fields


def test_a_valid_virtual_service_with_every_feature_loads():
    text = HEAD + """  hosts: [reviews]
  http:
  - name: jason
    match:
    - headers:
        end-user: {exact: jason}
      withoutHeaders:
        x-debug: {}
      queryParams:
        v: {regex: "^[0-9]+$"}
      uri: {prefix: /reviews}
      method: {exact: GET}
      scheme: {exact: https}
      authority: {regex: "^reviews(\\\\.bookinfo)?(:[0-9]+)?$"}
    route:
    - destination: {host: reviews, subset: v2}
      weight: 75
      headers:
        request: {set: {x-route: jason}}
    - destination: {host: reviews, subset: v1}
      weight: 25
    timeout: 1.5s
    retries: {attempts: 3, perTryTimeout: 500ms, retryOn: "5xx,reset,503,unavailable"}
    fault:
      delay: {fixedDelay: 100ms, percentage: {value: 0.5}}
      abort: {grpcStatus: UNAVAILABLE, percentage: {value: 0.1}}
    mirror: {host: reviews, subset: v1}
    mirrorPercentage: {value: 10}
    corsPolicy:
      allowOrigins: [{prefix: "https://"}]
      allowMethods: [GET, POST]
      allowHeaders: ["*"]
      maxAge: 24h
    headers:
      request: {add: {x-start: "%START_TIME(%s)%", x-pct: "100%%", x-peer: "%REQ(x-user):10%"}, remove: [x-internal]}
      response: {set: {x-served-by: reviews}}
  - name: old
    match: [{uri: {prefix: /old}}]
    redirect: {uri: /reviews, redirectCode: 301}
  - name: gone
    match: [{uri: {exact: /gone}}]
    directResponse: {status: 410, body: {string: gone}}
  - name: rewrite
    match: [{uri: {prefix: /r/}}]
    rewrite: {uriRegexRewrite: {match: "^/r/(.*)$", rewrite: "/\\\\1"}}
    route: [{destination: {host: reviews}}]
""" + SUPPORT
    config = load_texts({"vs.yaml": text})
    assert [r.kind for r in config] == ["VirtualService", "DestinationRule"]
    assert [d for d in config.warnings if d.severity == "warning" and "IST0101" != d.code] == []


def test_unreachable_rule_is_a_warning_not_an_error():
    text = HEAD + """  hosts: [reviews]
  http:
  - route: [{destination: {host: reviews, subset: v1}}]
  - match: [{uri: {prefix: /}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route: [{destination: {host: reviews, subset: v2}}]
""" + SUPPORT
    config = load_texts({"vs.yaml": text})
    codes = {(d.code, d.field) for d in config.warnings}
    assert ("IST0130", "spec.http[2]") in codes
