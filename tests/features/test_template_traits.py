"""What SGLang reads off a template before rendering: content format, tool-result pairing."""

from __future__ import annotations

import pytest

from smetric_router.features.model_files import locate, model_chat_template
from smetric_router.features.template_traits import OPENAI, STRING, template_traits


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ messages[0]['content'] }}", STRING),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", STRING),
        ("{% for message in messages %}{% for p in message['content'] %}{% endfor %}{% endfor %}",
         OPENAI),
        ("{% for message in messages %}{% for p in message.content %}{% endfor %}{% endfor %}",
         OPENAI),
        ("{% for msg in messages %}{% for p in msg.content | list %}{% endfor %}{% endfor %}",
         OPENAI),
        ("{% for m in messages %}{% for p in m.content[1:] %}{% endfor %}{% endfor %}", OPENAI),
        ("{% for x in messages %}{% for p in x.content %}{% endfor %}{% endfor %}", STRING),
        ("{# renders an image placeholder #}{{ messages }}", OPENAI),
        ("{% for %}", STRING),  # a template that does not parse
    ],
)  # fmt: skip
def test_content_format(source: str, expected: str) -> None:
    assert template_traits(source).content_format == expected


def test_known_templates() -> None:
    bundled = model_chat_template(locate(None))
    assert bundled is not None and template_traits(bundled).content_format == OPENAI


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ m.content }}", False),
        ("{{ m.tool_call_id }}", True),
        ("{{ m['tool_call_id'] }}", True),
        ("{{ m.get('tool_call_id') }}", True),
        ("{{ ms | map(attribute='tool_call_id') | list }}", True),
        ("{{ ms | selectattr('tool_call_id') | list }}", True),
    ],
)
def test_pairs_tool_results_by_id(source: str, expected: bool) -> None:
    assert template_traits(source).pairs_tool_results_by_id is expected
