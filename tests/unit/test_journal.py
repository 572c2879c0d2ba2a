"""Journal ids (proxgpu.apply.journal): they sort as the applies happened."""

from __future__ import annotations

from datetime import UTC, datetime

from proxgpu.apply.journal import new_journal_id


def test_journal_ids_sort_by_time() -> None:
    ids = [new_journal_id(datetime(2026, 11, 30, h, tzinfo=UTC)) for h in (9, 10, 23)]
    assert ids == sorted(ids) and ids[0].startswith("20261130T090000.000000Z-")
