from pathlib import Path

from sapo.node.daemon.settings import field_owner
from sapo.node.daemon.settings_doc import settings_markdown, splice

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_settings_reference_is_current():
    text = README.read_text()
    assert splice(text) == text, "README's settings table is stale: run `make docs`"


def test_reference_lists_every_setting():
    table = settings_markdown()
    for name in field_owner():
        assert f"`--{name.replace('_', '-')}`" in table
