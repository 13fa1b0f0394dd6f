from pathlib import Path

from sapo.node.core.settings import field_owner
from sapo.node.daemon.settings_doc import settings_markdown, splice

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "settings.md"


def test_settings_reference_is_current():
    text = REFERENCE.read_text()
    assert splice(text) == text, "docs/settings.md is stale: run `make docs`"


def test_reference_lists_every_setting():
    table = settings_markdown()
    for name in field_owner():
        assert f"`--{name.replace('_', '-')}`" in table
