"""The inventory's records (proxgpu.record): dumped as pydantic dumps them, validated by pydantic
when read back, and an offline ``inspect --json`` that never loads pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Gpu, Inventory, NumaNode

REPO = Path(__file__).resolve().parents[2]


def test_dump_is_what_pydantic_dumps(example_host: Path) -> None:
    inventory = inspect(DirectoryHost(str(example_host)))
    pydantic = TypeAdapter(Inventory)
    ours = inventory.model_dump(mode="json")
    # The same keys in the same order and the same values: the JSON contract's bytes.
    assert json.dumps(ours) == json.dumps(pydantic.dump_python(inventory, mode="json"))
    assert inventory.model_dump() == pydantic.dump_python(inventory)
    assert inventory.model_dump_json() == pydantic.dump_json(inventory).decode()
    assert inventory.model_dump_json(indent=2) == pydantic.dump_json(inventory, indent=2).decode()
    assert Inventory.model_validate(ours) == inventory
    assert Inventory.model_validate_json(inventory.model_dump_json()) == inventory


def test_validation_refuses_unknown_and_mistyped_fields() -> None:
    gpu = {
        "address": "0000:01:00.0",
        "vendor_id": "10de",
        "device_id": "2330",
        "class_code": "0x030200",
        "functions": ["0000:01:00.0"],
        "function_info": [],
    }
    assert Gpu.model_validate({**gpu, "numa_node": "1"}).numa_node == 1  # lax, as a model is
    with pytest.raises(ValidationError, match="numa_node"):
        Gpu.model_validate({**gpu, "numa_node": "one"})
    with pytest.raises(ValidationError, match="bogus"):
        Gpu.model_validate({**gpu, "function_info": [{"bogus": 1}]})
    with pytest.raises(ValidationError, match="Unexpected keyword argument"):
        NumaNode.model_validate({"id": 0, "cpus": "0-3", "bogus": 1})
    assert "id" in NumaNode.model_json_schema()["required"]


def test_records_are_frozen_and_copies_take_known_fields_only() -> None:
    node = NumaNode(id=0, cpus="0-3")
    with pytest.raises(FrozenInstanceError):
        node.id = 1  # type: ignore[misc]
    assert node.model_copy(update={"id": 1}) == NumaNode(id=1, cpus="0-3")
    assert node == NumaNode(id=0, cpus="0-3")
    with pytest.raises(TypeError, match="bogus"):
        node.model_copy(update={"bogus": 1})


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
