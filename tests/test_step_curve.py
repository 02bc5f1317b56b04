"""StepCurve files: loading refuses anything but a saved curve, naming the file."""

import pytest

from hf_dspark.step_curve import StepCurve


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", "is not a step-curve JSON file"),
    ("3", "is a JSON object, got int"),
    ('{"batch_tokens": ["1"], "steps_per_second": [2.0]}', "lists of numbers"),
    ('{"batch_tokens": [1], "steps_per_second": [2.0], "threads": "x"}', "'threads' must be an integer"),
    ('{"format_version": 99, "batch_tokens": [1], "steps_per_second": [2.0]}', "format_version 99"),
])
def test_load_names_the_file_and_the_problem(tmp_path, text, match):
    path = tmp_path / "curve.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as error:
        StepCurve.load(path)
    assert str(path) in str(error.value)
