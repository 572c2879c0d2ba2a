"""The inventory's records: frozen dataclasses whose dump is the JSON contract pydantic would
write for their types, and an offline ``inspect --json`` that never loads pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import FrozenInstanceError, asdict, replace
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.document import inventory_document
from proxgpu.inspection.inventory import Inventory, NumaNode

REPO = Path(__file__).resolve().parents[2]


def test_the_document_is_what_pydantic_dumps_for_the_declared_types(example_host: Path) -> None:
    inventory = inspect(DirectoryHost(str(example_host)))
    typed = TypeAdapter(Inventory)
    # The same keys in the same order and the same values: the JSON contract's bytes. The
    # example holds no secret, so redaction leaves the document as dumped.
    assert json.dumps(inventory_document(inventory)) == json.dumps(
        typed.dump_python(inventory, mode="json")
    )
    # Read back through the declared types, the dump is the inventory again.
    assert typed.validate_python(asdict(inventory)) == inventory


def test_records_are_frozen_and_copies_take_known_fields_only() -> None:
    node = NumaNode(id=0, cpus="0-3")
    with pytest.raises(FrozenInstanceError):
        node.id = 1  # type: ignore[misc]
    assert replace(node, id=1) == NumaNode(id=1, cpus="0-3")
    assert node == NumaNode(id=0, cpus="0-3")
    with pytest.raises(TypeError, match="bogus"):
        replace(node, bogus=1)  # type: ignore[call-arg]


def test_offline_inspect_json_never_loads_pydantic() -> None:
    # The whole command in a fresh interpreter, then which modules it loaded.
    script = (
        "import sys\n"
        "from proxgpu.cli import main\n"
        "code = main(['inspect', '--root', 'examples/hosts/ct200', '--json'])\n"
        "print(code, 'pydantic' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stderr.split() == ["0", "False"]
    assert json.loads(done.stdout)["hostname"] == "ct200"
