"""model_cards/ holds exactly the cards shipped with the drafters (written together by the ship script)."""

from pathlib import Path

import pytest

from hf_dspark.defaults import DEFAULT_DRAFTER_VARIANTS, default_drafter_dir

MODEL_CARDS = Path(__file__).resolve().parents[1] / "model_cards"


@pytest.mark.parametrize("variant", sorted(DEFAULT_DRAFTER_VARIANTS))
def test_published_card_equals_the_shipped_card(variant):
    shipped = default_drafter_dir(variant) / "README.md"
    published = MODEL_CARDS / f"{shipped.parent.name}.md"
    assert published.is_file(), f"{published} is missing: run scripts/ship_default_drafters.py tau/card for {variant}"
    assert published.read_bytes() == shipped.read_bytes(), (
        f"{published} differs from {shipped}: the ship script writes both; copy the shipped card over it"
    )


def test_every_published_card_belongs_to_a_shipped_drafter():
    shipped = {default_drafter_dir(v).name for v in DEFAULT_DRAFTER_VARIANTS}
    published = {p.stem for p in MODEL_CARDS.glob("*.md") if p.name != "README.md"}
    assert published == shipped
