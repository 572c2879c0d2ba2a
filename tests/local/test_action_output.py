"""A long follow-up action's output as it comes (proxgpu.apply.actions, ``action_output``):
real slow commands on a live host (this machine rooted at a tree copy), their lines said while
they run, only the tail of each read, through apply, rollback and the fleet engine's events."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from proxgpu.ansible.request import change_options
from proxgpu.apply import ApplyOptions, rollback
from proxgpu.apply.actions import run_followed
from proxgpu.apply.options import ACTION_TIMEOUT
from proxgpu.apply.transaction import apply_changes
from proxgpu.cli.commandline import ACTION_OUTPUT, read
from proxgpu.cli.parser import build_parser
from proxgpu.cli.shown import StepPrinter
from proxgpu.errors import CommandError, CommandTimeoutError, JournalError
from proxgpu.fleet import Event, Say, Target, each_host
from proxgpu.host import Host
from proxgpu.host.local import LocalHost
from proxgpu.paths import JOURNAL_DIR, OUTPUT_DIR
from proxgpu.planning import Plan
from tests.support.trees import changeset

#: A plan with nothing to move at runtime: these applies are not live.
NO_PLAN = Plan(groups=[], warnings=[], tensor_parallel=[])
#: Prints a line every 0.4 s, as update-initramfs prints one per kernel.
SLOW = ["sh", "-c", 'for i in 1 2 3 4 5; do echo "update-initramfs: kernel $i"; sleep 0.4; done']


class Heard:
    """What was said, with when."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.said: list[tuple[float, str, str]] = []

    def __call__(self, step: str, message: str) -> None:
        self.said.append((time.monotonic() - self.start, step, message))

    def lines(self) -> list[str]:
        return [message for _, step, message in self.said if step == "output"]


def test_the_lines_come_while_the_action_runs_each_once(live_host: LocalHost, root: Path) -> None:
    heard = Heard()
    run_followed(live_host, SLOW, heard, lines=5, poll=0.2)
    ended = time.monotonic() - heard.start
    assert heard.lines() == [f"update-initramfs: kernel {i}" for i in range(1, 6)]
    first = heard.said[0][0]
    assert first < ended - 1.0, "the first line was said while the action still ran"
    assert list((root / OUTPUT_DIR.lstrip("/")).iterdir()) == [], "the log is removed"


def test_reads_racing_the_writes_lose_and_repeat_no_line(live_host: LocalHost) -> None:
    # Each read lands while the action writes: a line is said once it is whole, and once.
    quick = ["sh", "-c", "for i in $(seq 1 80); do printf '%s' $i; sleep 0.01; echo; done"]
    heard = Heard()
    run_followed(live_host, quick, heard, lines=100, poll=0.03)
    assert heard.lines() == [str(i) for i in range(1, 81)]


def test_only_the_tail_of_each_read_is_said(live_host: LocalHost) -> None:
    burst = ["sh", "-c", "seq 1 500; sleep 0.8; printf 'done, no newline'"]
    heard = Heard()
    run_followed(live_host, burst, heard, lines=3, poll=0.2)
    lines = heard.lines()
    assert lines[:3] == ["498", "499", "500"], "the 497 lines before the tail are never read"
    assert lines[3:] == ["done, no newline"], "a last line without a newline is said once"


def test_a_failed_action_is_named_with_its_last_line(live_host: LocalHost) -> None:
    failing = ["sh", "-c", "echo working; echo 'E: no space left on /boot' >&2; exit 3"]
    heard = Heard()
    with pytest.raises(CommandError, match=r"sh exited with 3: E: no space left on /boot") as err:
        run_followed(live_host, failing, heard, lines=5)
    assert err.value.argv == failing
    assert heard.lines() == ["working", "E: no space left on /boot"]


def test_an_apply_with_action_output_says_the_lines_as_output_steps(
    root: Path, live_host: LocalHost
) -> None:
    heard = Heard()
    result = apply_changes(
        live_host,
        changeset(root, actions=[SLOW]),
        options=ApplyOptions(action_output=5),
        progress=heard,
    )
    assert result.actions_run == [SLOW]
    steps = [step for _, step, _ in heard.said]
    assert steps.index("action") < steps.index("output")
    assert heard.lines()[-1] == "update-initramfs: kernel 5"
    # Rolled back with the same options, the action runs again and is followed again.
    again = Heard()
    rollback(live_host, options=ApplyOptions(action_output=5), progress=again)
    assert again.lines() == heard.lines()


def test_a_rollback_without_run_actions_restores_the_files_and_lists_the_actions(
    root: Path, live_host: LocalHost
) -> None:
    marker = root / "ran"
    touch = ["sh", "-c", f"echo again >> {marker}"]
    apply_changes(live_host, changeset(root, actions=[touch]), plan=NO_PLAN)
    assert marker.read_text() == "again\n"
    result = rollback(live_host, options=ApplyOptions(run_actions=False))
    assert result.files and result.actions_run == []
    assert marker.read_text() == "again\n", "the action did not run again"
    assert f"listed, not run: sh -c echo again >> {marker}" in result.messages


def test_ansible_change_options_carry_trust_unsigned_and_the_action_timeout(
    root: Path, live_host: LocalHost
) -> None:
    apply_changes(live_host, changeset(root, actions=[SLOW]), plan=NO_PLAN)
    (entry,) = (root / JOURNAL_DIR.lstrip("/")).glob("*.json")
    unsigned = json.loads(entry.read_text())
    unsigned.pop("signature")
    entry.write_text(json.dumps(unsigned))
    with pytest.raises(JournalError, match="not signed"):
        rollback(live_host, options=change_options({}, check=False))
    # Trusted, the rollback gets as far as the action, which the 0.5 s timeout then stops.
    how = change_options({"trust_unsigned": True, "action_timeout": 0.5}, check=False)
    with pytest.raises(CommandTimeoutError, match=r"within 0\.5 s"):
        rollback(live_host, options=how)
    assert change_options({"action_timeout": None}, check=False).action_timeout == ACTION_TIMEOUT


def test_without_action_output_nothing_is_followed(root: Path, live_host: LocalHost) -> None:
    heard = Heard()
    apply_changes(live_host, changeset(root, actions=[SLOW]), progress=heard)
    assert heard.lines() == []


def test_a_fleet_hears_each_hosts_lines_as_events_prefixed_with_the_host(
    root: Path, live_host: LocalHost
) -> None:
    events: list[Event] = []
    how = ApplyOptions(action_output=5)

    def work(host: Host, say: Say) -> list[list[str]]:
        changes = changeset(root, actions=[SLOW])
        return apply_changes(host, changes, how, plan=NO_PLAN, progress=say).actions_run

    def connect(target: Target) -> Host:
        return LocalHost(str(root))

    outcomes = each_host(
        {"pve2": Target(root=str(root))}, work, connect=connect, on_event=events.append
    )
    assert outcomes["pve2"].unwrap() == [SLOW]
    output = [e for e in events if e.step == "output"]
    assert [str(e) for e in output][-1] == "pve2:   | update-initramfs: kernel 5"
    end = next(e for e in events if e.step == "end")
    assert output[0].elapsed < end.elapsed - 1.0, "the first line came before the host ended"


def test_the_command_line_follows_with_v_and_rollback_takes_the_same_options() -> None:
    parser = build_parser()
    back = read(parser.parse_args(["rollback", "--force", "-v", "--host", "pve1"])).apply
    assert back == ApplyOptions(force=True, action_output=ACTION_OUTPUT)
    quiet = read(parser.parse_args(["apply", "--dry-run", "--live", "--root", "t"])).apply
    assert quiet == ApplyOptions(dry_run=True, live=True)


def test_one_hosts_progress_shows_the_lines_under_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say = StepPrinter("pve1")
    say("action", "update-initramfs -u -k all")
    say("output", "update-initramfs: Generating /boot/initrd.img-6.8.12-4-pve")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("] action: update-initramfs -u -k all")
    assert lines[1] == "  | update-initramfs: Generating /boot/initrd.img-6.8.12-4-pve"
