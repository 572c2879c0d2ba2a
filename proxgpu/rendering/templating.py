"""The Jinja2 templates in ``templates/``: the files proxgpu owns, and the picture's markup.

One loader serves both; they differ in escaping. Config files and shell are rendered as they are
(:func:`render_template`); SVG and HTML escape every value (:func:`render_markup`), so that host
data (a model name, a guest config) never becomes markup.

>>> render_template("driverctl-override.j2", driver="vfio-pci")
'vfio-pci\\n'
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
        # Run from a source checkout without installing: templates/ sits beside the package.
        return resources.files("proxgpu").joinpath("..", "templates")


@cache
def _environment(markup: bool) -> jinja2.Environment:
    def load(name: str) -> str:
        return _templates().joinpath(name).read_text(encoding="utf-8")

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        trim_blocks=True,
        lstrip_blocks=True,
        # A config file ends as its template does; markup's last newline does not matter.
        keep_trailing_newline=not markup,
        undefined=jinja2.StrictUndefined,
        autoescape=markup,
    )


def render_template(name: str, **values: object) -> str:
    """Render one config or shell template from ``templates/`` with ``values``, unescaped.

    >>> render_template("driverctl-override.j2", driver="vfio-pci")
    'vfio-pci\\n'
    """
    return _environment(markup=False).get_template(name).render(**values)


def render_markup(name: str, **values: object) -> str:
    """Render an SVG or HTML template with ``values``, escaping each for XML and HTML.

    >>> render_markup("picture.css.j2").startswith("/*")
    True
    """
    return _environment(markup=True).get_template(name).render(**values)
