"""The admission webhook's protocol (xds.admission.review), sans-IO: the same verdict and
message as `mcpctl validate`, the field path where the file:line stands; hostile bodies."""
import json

import pytest

from mcp26.mesh.change_set import load_texts
from mcp26.mesh.diagnostics import ConfigError
from mcp26.xds.admission import review

BAD_VS = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
          "metadata": {"name": "reviews", "namespace": "bookinfo"},
          "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}, "weight": -3}]}]}}


def request(obj, operation="CREATE", uid="u-1"):
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": operation, "object": obj}}).encode()


def test_a_bad_virtualservice_is_denied_with_mcpctl_validates_message():
    out = review(request(BAD_VS))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["response"]["uid"] == "u-1"
    assert out["response"]["allowed"] is False
    with pytest.raises(ConfigError) as e:
        load_texts({"vs.yaml": json.dumps(BAD_VS)})
    (d,) = [d for d in e.value.diagnostics if d.severity == "error"]
    # mcpctl validate: FILE:LINE: error: VirtualService/bookinfo/reviews: spec...weight: weight -3 < 0
    assert str(d).split(": ", 2)[2] in out["response"]["status"]["message"]
    assert out["response"]["status"]["message"] == ('admission webhook "validation.mcp-mesh.io" denied the request: '
                                                     "VirtualService/bookinfo/reviews: spec.http[0].route[0].weight: "
                                                     "weight -3 < 0")
    assert out["response"]["status"]["code"] == 400


def test_good_unknown_and_delete_are_allowed():
    good = json.loads(json.dumps(BAD_VS))
    good["spec"]["http"][0]["route"][0].pop("weight")
    assert review(request(good))["response"] == {"uid": "u-1", "allowed": True}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}
    assert review(request(config_map))["response"]["allowed"] is True
    assert review(request(BAD_VS, operation="DELETE"))["response"]["allowed"] is True


@pytest.mark.adversarial
@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"request": null}', b'{"request": {"object": {}}}',
                                  b"\xff\xfe", json.dumps({"request": {"uid": "x"}}).encode()[:-3]])
def test_what_is_not_a_review_is_an_error_not_a_verdict(body):
    with pytest.raises(ValueError, match="not an admission.k8s.io/v1 AdmissionReview"):
        review(body)


@pytest.mark.adversarial
def test_hostile_objects_get_a_verdict_with_their_uid():
    deep = {}
    cur = deep
    for _ in range(200):
        cur["x"] = {}
        cur = cur["x"]
    cases = [
        {**BAD_VS, "spec": "not a mapping"},
        {**BAD_VS, "metadata": ["list"]},
        {**BAD_VS, "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}], **deep}},
        {**BAD_VS, "spec": {"hosts": ["r"] * 50_000}},
        {"kind": "VirtualService"},
    ]
    for obj in cases:
        out = review(request(obj, uid="u-9"))
        assert out["response"]["uid"] == "u-9"
        assert out["response"]["allowed"] is False, obj if len(json.dumps(obj)) < 300 else obj["metadata"]
        assert len(out["response"]["status"]["message"]) <= 4096
