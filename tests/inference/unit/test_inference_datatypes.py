"""KServe tensor encodings: raw little-endian, BYTES length-prefixed, JSON lists."""
from __future__ import annotations

import numpy as np
import pytest

from mcp26.inference import datatypes as D
from mcp26.inference.errors import InvalidArgument
from mcp26.inference.load_report import format_text_report, parse_text_report


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "INT16", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64"])
def test_raw_round_trip(datatype):
    dt = D.DTYPES[datatype]
    a = (np.arange(12) % 2 == 0) if datatype == "BOOL" else (np.arange(12) * 3 - 5).astype(dt)
    a = a.reshape(3, 4)
    back = D.from_raw("t", datatype, (3, 4), D.to_raw(a))
    np.testing.assert_array_equal(back, a)
    assert D.datatype_of(back) == datatype


def test_bytes_are_length_prefixed():
    a = np.array([b"ab", b"", b"\xffz"], dtype=object)
    raw = D.to_raw(a)
    assert raw == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xffz"
    assert list(D.from_raw("s", "BYTES", (3,), raw)) == [b"ab", b"", b"\xffz"]
    with pytest.raises(InvalidArgument, match="overruns"):
        D.from_raw("s", "BYTES", (1,), b"\x09\x00\x00\x00ab")


def test_raw_size_must_match_shape():
    with pytest.raises(InvalidArgument, match="10 bytes of raw data, but shape \\[1, 4\\] of FP32 needs 16"):
        D.from_raw("x", "FP32", (1, 4), b"\0" * 10)


def test_json_nested_and_flat_lists():
    flat = D.from_list("x", "INT32", (2, 2), [1, 2, 3, 4])
    nested = D.from_list("x", "INT32", (2, 2), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(flat, nested)
    assert flat.dtype == np.int32


@pytest.mark.parametrize("datatype, data, words", [
    ("INT32", [1.5, 2], "non-integer"),
    ("UINT8", [300], "out of range"),
    ("FP32", ["a"], "not FP32"),
    ("BOOL", [1], "true/false"),
    ("FP32", [1, 2, 3], "3 elements for shape [2]"),
])
def test_json_bad_values_are_invalid_argument(datatype, data, words):
    shape = (len(data),) if "elements" not in words else (2,)
    with pytest.raises(InvalidArgument, match=words.replace("[", "\\[").replace("]", "\\]")):
        D.from_list("x", datatype, shape, data)


def test_orca_text_report_is_what_envoy_parses():
    text = format_text_report({"cpu_utilization": 0.25, "application_utilization": 1.0, "rps_fractional": 12.5},
                              {"queue_depth": 3})
    # Envoy: "TEXT " then comma-separated name:value (orca_parser.cc, kHeaderFormatPrefixText)
    assert text == "TEXT cpu_utilization:0.25, application_utilization:1, rps_fractional:12.5, named_metrics.queue_depth:3"
    assert parse_text_report(text)["named_metrics.queue_depth"] == 3.0


def test_load_sampler_reports_busy_fraction_and_rate():
    import time
    from mcp26.inference.load_report import SAMPLE_INTERVAL_S, LoadSampler
    state = {"busy": 0, "done": 0, "queued": 5}
    sampler = LoadSampler(lambda: state["busy"], lambda: state["done"], lambda: state["queued"], cpus=2)
    t0 = time.monotonic()
    time.sleep(SAMPLE_INTERVAL_S + 0.05)
    elapsed = time.monotonic() - t0
    state["busy"] = int(0.5 * elapsed * 1e9)      # compute busy half of the interval
    state["done"] = 30
    report = parse_text_report(sampler.header_value())
    assert 0.4 <= report["application_utilization"] <= 0.55
    assert 30 / (elapsed + 0.05) <= report["rps_fractional"] <= 30 / elapsed + 1
    assert report["named_metrics.queue_depth"] == 5 and 0 <= report["cpu_utilization"] <= 1
    # the sampled part is formatted once per sample: the header is still exactly the full report
    assert sampler.header_value() == format_text_report(sampler.values, {"queue_depth": 5})
