"""Each Ansible module documents exactly the options it validates: the collection's modules
(``proxgpu.pve.*``, whose argument specs are :data:`tasks.MODULES`'s) and the standalone
``proxgpu_split`` (:data:`proxgpu.ansible.proxgpu_split.ARGUMENTS`).

The documentation is read as users get it, by ``ansible-doc --json``: doc fragments merged, YAML
parsed by Ansible. Each option must agree with the argument spec on everything that changes
what a task accepts or gets (name, type, elements, choices, default, required, aliases and
nested suboptions); a mismatch fails naming the module, the option and both values.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible_collections.proxgpu.pve.plugins.plugin_utils.tasks import MODULES

from proxgpu.ansible import proxgpu_split
from tests.support.collection import ansible
from tests.support.trees import REPO

#: Every module's argument spec, under the name ``ansible-doc`` knows it by.
SPECS: dict[str, dict[str, Any]] = {
    **{f"proxgpu.pve.{name}": arguments for name, (arguments, _) in MODULES.items()},
    "proxgpu_split": proxgpu_split.ARGUMENTS,
}

#: What Ansible assumes for a key that the spec or the documentation leaves out, so that an
#: omission on one side and the same value spelled out on the other agree, as they behave alike
#: (an option without ``type`` is a string, without ``required`` optional, without ``default``
#: None). Keys not here have no such value: absent is None.
IMPLIED: dict[str, Any] = {"type": "str", "required": False}

#: The keys compared, as the argument spec names them; the documentation's nested options are
#: ``suboptions`` (compared by :func:`mismatches`'s recursion, not as a value).
KEYS = ("type", "elements", "choices", "default", "required", "aliases")


def mismatches(
    module: str, documented: dict[str, Any], spec: dict[str, Any], parent: str = ""
) -> list[str]:
    """One line per difference between documented options and an argument spec, each naming
    the module, the option (dotted below its parent for suboptions) and both values.

    >>> mismatches("m", {"a": {"type": "int"}}, {"a": {"type": "int", "default": 0}})
    ['m: option a: default: documented None, argument spec 0']
    >>> for line in mismatches("m", {"a": {}, "b": {}}, {"a": {"type": "str"}, "c": {}}):
    ...     print(line)
    m: option b: documented, not in the argument spec
    m: option c: in the argument spec, not documented
    """
    lines = []
    for name in sorted(documented.keys() - spec.keys()):
        lines.append(f"{module}: option {parent}{name}: documented, not in the argument spec")
    for name in sorted(spec.keys() - documented.keys()):
        lines.append(f"{module}: option {parent}{name}: in the argument spec, not documented")
    for name in sorted(documented.keys() & spec.keys()):
        doc, arg = documented[name], spec[name]
        for key in KEYS:
            doc_value, arg_value = doc.get(key, IMPLIED.get(key)), arg.get(key, IMPLIED.get(key))
            if doc_value != arg_value:
                lines.append(
                    f"{module}: option {parent}{name}: {key}: "
                    f"documented {doc_value!r}, argument spec {arg_value!r}"
                )
        lines += mismatches(
            module, doc.get("suboptions") or {}, arg.get("options") or {}, f"{parent}{name}."
        )
    return lines


@pytest.fixture(scope="module")
def documented(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each module's options as ``ansible-doc --json`` gives them, by module name: one run for
    every module, the standalone one found in its directory (``-M``) as ANSIBLE_LIBRARY would."""
    library = REPO / "proxgpu" / "ansible"
    scratch = tmp_path_factory.mktemp("ansible-doc")
    completed = ansible("ansible-doc", scratch, "--json", "-M", str(library), *sorted(SPECS))
    assert completed.returncode == 0, completed.stderr
    docs: dict[str, Any] = json.loads(completed.stdout)
    # A module whose documentation Ansible cannot read is left out of the output, not failed.
    assert docs.keys() == SPECS.keys(), completed.stderr
    return {name: doc["doc"].get("options") or {} for name, doc in docs.items()}


@pytest.mark.parametrize("module", sorted(SPECS))
def test_the_documented_options_are_those_the_module_validates(
    module: str, documented: dict[str, dict[str, Any]]
) -> None:
    found = mismatches(module, documented[module], SPECS[module])
    assert not found, "\n".join(found)


def test_a_difference_in_any_compared_key_or_suboption_is_named() -> None:
    spec = {
        "a": {
            "type": "list",
            "elements": "dict",
            "required": True,
            "aliases": ["b"],
            "options": {"c": {"type": "str", "choices": ["x", "y"], "default": "x"}},
        }
    }
    documented = {
        "a": {
            "type": "list",
            "elements": "dict",
            "required": True,
            "aliases": ["b"],
            "suboptions": {"c": {"choices": ["x", "y"], "default": "x"}},
        }
    }
    # Equal, with the implied type of c left out of the documentation.
    assert mismatches("m", documented, spec) == []
    changes: list[tuple[dict[str, Any], str]] = [
        ({"type": "raw"}, "m: option a: type: documented 'raw', argument spec 'list'"),
        ({"elements": "str"}, "m: option a: elements: documented 'str', argument spec 'dict'"),
        ({"required": False}, "m: option a: required: documented False, argument spec True"),
        ({"aliases": None}, "m: option a: aliases: documented None, argument spec ['b']"),
        (
            {"suboptions": {"c": {"choices": ["x"], "default": "x"}}},
            "m: option a.c: choices: documented ['x'], argument spec ['x', 'y']",
        ),
        (
            {"suboptions": {"c": {"choices": ["x", "y"]}}},
            "m: option a.c: default: documented None, argument spec 'x'",
        ),
    ]
    for change, line in changes:
        assert mismatches("m", {"a": {**documented["a"], **change}}, spec) == [line]
