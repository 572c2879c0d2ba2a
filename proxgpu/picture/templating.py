"""The picture's Jinja2 templates (``picture.svg.j2``, ``report.html.j2`` in ``templates/``),
rendered with HTML escaping on: host data (a model name, a guest config) never becomes markup.

>>> render_markup("picture.css.j2").startswith("/*")
True
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

import jinja2


def _templates() -> Traversable:
    try:
        return resources.files("proxgpu.templates")
    except ModuleNotFoundError:
        # A source checkout that is not installed: templates/ sits beside the package.
        return resources.files("proxgpu").joinpath("..", "templates")


@cache
def _environment() -> jinja2.Environment:
    def load(name: str) -> str:
        return _templates().joinpath(name).read_text(encoding="utf-8")

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        autoescape=True,  # SVG and HTML: every value from the host is escaped
    )


def render_markup(name: str, **values: object) -> str:
    """Render the template ``name`` with ``values``, escaping each for XML and HTML.

    >>> "pg-gpu-vfio" in render_markup("picture.css.j2")
    True
    """
    return _environment().get_template(name).render(**values)
