"""The saved-plan file of ``plan --out`` and ``apply --plan`` (as ``terraform plan -out``):
the plan, every file's text as read and as planned with the hash of each as read, signed with
the admin's key."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from proxgpu.apply import signing
from proxgpu.apply.remote import sha
from proxgpu.errors import UsageError
from proxgpu.planning import Plan
from proxgpu.rendering.changes import ChangeSet

#: What a saved plan file says it is, so that no other JSON is taken for one.
PLAN_FILE_KIND = "proxgpu-plan"
PLAN_FILE_VERSION = 1


@dataclass(frozen=True)
class SavedPlan:
    """A plan saved by ``plan --out``: the host it was made for, the plan, its change set."""

    host: str
    plan: Plan
    changes: ChangeSet


def save_plan(
    path: str, host: str, plan: Plan, changes: ChangeSet, *, key: bytes | None = None
) -> None:
    """Write a plan file for :func:`load_plan` (``terraform plan -out``): the plan, every file's
    text as read and as planned, and the SHA-256 of each as read, so that applying it refuses a
    file changed since. It holds guest configs, secrets included: it is made readable by the
    owner only. It is signed with the admin's key (``key``: that one; see
    :mod:`proxgpu.apply.signing`), over the host's name and the hashes of the files read too.
    """
    unsigned = {
        "kind": PLAN_FILE_KIND,
        "schema_version": PLAN_FILE_VERSION,
        "host": host,
        "sha256_before": {f.path: sha(f.before) for f in changes.files},
        "plan": plan.model_dump(mode="json"),
        "changes": changes.model_dump(mode="json"),
    }
    document = signing.sign(unsigned, key if key is not None else signing.load_key())
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2)
        out.write("\n")


def load_plan(path: str, *, trust_unsigned: bool = False, key: bytes | None = None) -> SavedPlan:
    """Read a plan file written by :func:`save_plan`, signed with the admin's key (``key``:
    that one) unless ``trust_unsigned``.

    :raises UsageError: when it is not one, its signature is missing or wrong, or its texts no
        longer match their hashes.
    """
    try:
        with open(path, encoding="utf-8") as source:
            document = json.load(source)
        if document.get("kind") != PLAN_FILE_KIND:
            raise ValueError("not a proxgpu plan file")
        if document.get("schema_version") != PLAN_FILE_VERSION:
            raise ValueError(f"plan file version {document.get('schema_version')} is not 1")
        problem = None if trust_unsigned else signing.check(document, key or signing.load_key())
        if problem is not None:
            raise ValueError(
                f"{problem}; refused: save it again with `proxgpu plan --out` on this machine, "
                "or pass --trust-unsigned if you have checked it by hand"
            )
        saved = SavedPlan(
            host=str(document["host"]),
            plan=Plan.model_validate(document["plan"]),
            changes=ChangeSet.model_validate(document["changes"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    hashes = document.get("sha256_before", {})
    for change in saved.changes.files:
        if hashes.get(change.path) != sha(change.before):
            raise UsageError(f"{path}: the saved text of {change.path} does not match its hash")
    return saved
