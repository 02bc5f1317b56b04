"""StepCurve files: loading refuses anything but a saved curve, naming the file."""

import pytest
import torch

from hf_dspark.profiling.step_curve import StepCurve


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


def test_scalar_and_tensor_lookups_agree():
    """SPS(B) for an int (plain Python, once per round) equals the tensor path, inside, on and beyond the points."""
    generator = torch.Generator().manual_seed(0)
    for size in (1, 2, 5):
        tokens = sorted(set((torch.randperm(500, generator=generator)[:size] + 1).tolist()))
        speeds = (1.0 + 40.0 * torch.rand(len(tokens), generator=generator)).tolist()
        curve = StepCurve(tokens, speeds)
        queries = list(range(1, 700, 3)) + tokens
        scalar = torch.tensor([curve.steps_per_second_at(b) for b in queries], dtype=torch.float64)
        torch.testing.assert_close(scalar, curve.steps_per_second_at(torch.tensor(queries)), rtol=1e-12, atol=0.0)
        assert [curve.steps_per_second_at(b) for b in tokens] == pytest.approx(speeds, rel=1e-12)
