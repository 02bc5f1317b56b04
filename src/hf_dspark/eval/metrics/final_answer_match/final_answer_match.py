"""Exact match of final answers: `\\boxed{...}` (or the last number) of each prediction against a reference."""

import datasets
import evaluate

from hf_dspark.eval.lossless import final_answer

_DESCRIPTION = """
The share of predictions whose final answer equals the reference's. A text's final answer is the content of its
last `\\boxed{...}`, else its last number (commas dropped, a trailing `.0` removed); a text with neither has no
answer and never matches. References are texts too (a bare answer such as "18" is its own final answer).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: generated texts.
    references: reference texts or answers.
Returns:
    exact_match: matches / predictions.
    matches: the number of matches.
    answered: predictions that had a final answer at all.
Examples:
    >>> metric = evaluate.load(metric_path("final_answer_match"))
    >>> metric.compute(predictions=["so \\\\boxed{18}", "it is 7"], references=["18", "8"])["exact_match"]
    0.5
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class FinalAnswerMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        answers = [final_answer(text) for text in predictions]
        matches = sum(a is not None and a == final_answer(r) for a, r in zip(answers, references))
        return {"exact_match": matches / len(predictions) if predictions else None, "matches": matches,
                "answered": sum(a is not None for a in answers)}
