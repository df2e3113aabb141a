"""Where the haproxy templates live and the jinja2 environment that renders them.

The templates are package data beside this module
(`lbagent/haproxy/templates/`, which the repository's top-level `templates`
names too), so a wheel and a checkout find them in the same place. The
environment refuses undefined names and has one filter, `token`, through
which every interpolated value goes. Templates are
compiled once (`preload`, at start) and never looked at again: they change
only with the agent itself.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

from lbagent.haproxy.errors import RenderError

# One haproxy config word: printable ASCII without space, quotes, '#' (comment)
# or backslash (escape). Anything else could end the word, the line, or start a
# comment where haproxy would then read something we did not mean.
_TOKEN_RE = re.compile(r"[!$-&(-\[\]-~]+")


def template_dir() -> Path:
    return Path(__file__).resolve().parent / "templates"


def token(value: object) -> str:
    """`value` as one haproxy config word, or RenderError."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RenderError(f"not a config value: {value!r}")
    text = str(value)
    if not _TOKEN_RE.fullmatch(text):
        raise RenderError(f"unsafe in a haproxy config line: {text!r}")
    return text


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # No stat() of every template (and its imports) on every render.
        auto_reload=False,
        autoescape=False,  # noqa: S701 - not HTML; `token` guards every value instead
    )
    env.filters["token"] = token
    return env


def preload() -> None:
    """Compile every template now (tens of milliseconds), not in the first burst of passes."""
    env = environment()
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)
