from pathlib import Path

from sapo.node.settings import field_owner
from sapo.node.settings_doc import settings_markdown, splice

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_settings_reference_is_current():
    text = README.read_text()
    assert splice(text) == text, "README's settings table is stale: run `make docs`"


def test_reference_lists_every_setting():
    table = settings_markdown()
    for name in field_owner():
        assert f"`--{name.replace('_', '-')}`" in table
