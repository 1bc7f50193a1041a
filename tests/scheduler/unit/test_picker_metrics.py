"""The picker's /metrics: a client choosing `model` names cannot grow the scrape without bound."""
from mcp26.scheduler.prometheus import MAX_MODEL_SERIES, OTHER_MODEL, PickerMetrics


def test_model_names_past_the_limit_are_one_series():
    m = PickerMetrics()
    for i in range(MAX_MODEL_SERIES + 50):
        m.decided(f"model-{i}", None, 0.0001)
    m.decided("model-0", 429, 0.0001)                       # a name already counted keeps its series
    text = m.text().decode()
    series = [line for line in text.splitlines() if line.startswith("inference_objective_request_total{")]
    assert len(series) == MAX_MODEL_SERIES + 1
    assert f'inference_objective_request_total{{model_name="{OTHER_MODEL}",target_model_name="{OTHER_MODEL}"}} 50.0' in text
    assert 'error_code="InferencePoolResourceExhausted",model_name="model-0"' in text
