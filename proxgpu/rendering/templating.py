"""The Jinja2 templates of the files proxgpu owns (``templates/`` in the source tree).

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
def _environment() -> jinja2.Environment:
    def load(name: str) -> str:
        return _templates().joinpath(name).read_text(encoding="utf-8")

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # plain config files and shell, never HTML
    )


def render_template(name: str, **values: object) -> str:
    """Render one template from ``templates/`` with ``values``.

    >>> render_template("driverctl-override.j2", driver="vfio-pci")
    'vfio-pci\\n'
    """
    return _environment().get_template(name).render(**values)
