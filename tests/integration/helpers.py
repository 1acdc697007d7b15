"""Constants and helpers shared by the integration tests."""

from sqlalchemy.engine import make_url

from catalog.config import MeasureConfig

SEED_STEPS = (64, 128, 300)
SEED_CONFIG = MeasureConfig(operand_hi=20, pairs_per_op=20, faithfulness_prompts=40)


def reader_url(url: str) -> str:
    """The same database, as the read-only analysts' role."""
    return make_url(url).set(username="catalog_reader", password=None).render_as_string(
        hide_password=False)
