"""The command line speaks its users' conventions: --version, --json everywhere (errors too),
NO_COLOR and --color, -v/-q, a saved plan, Terraform's detailed exit codes, a pending reboot
told apart from drift, and check-gpus' own exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxgpu.cli import main
from tests.support.trees import EXAMPLES, REPO, copy_example

SPLIT = ["--lxc", "200", "--vm", "300"]


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command line in a child process, as a user runs it (no terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "proxgpu", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def test_version_is_the_installed_one() -> None:
    from importlib.metadata import version  # noqa: PLC0415 - the thing under comparison

    done = run("--version")
    assert done.returncode == 0 and done.stdout == f"proxgpu {version('proxgpu')}\n"


def test_a_failure_with_json_is_a_json_error_document_with_the_same_code(tmp_path: Path) -> None:
    done = run("inspect", "--root", str(tmp_path / "missing"), "--json")
    document = json.loads(done.stdout)
    assert done.returncode == 2 == document["error"]["code"]
    assert document["error"]["kind"] == "UsageError"
    assert "no such directory" in document["error"]["message"]
    assert done.stderr.count("\n") == 1, "the one-line message stays on stderr"


def test_a_refused_plan_in_json_carries_the_fixes() -> None:
    # A mapping name Proxmox refuses (it must start with a letter).
    argv = ["--lxc", "200", "--vm", "300", "--mapping", "9-gpus", "--json"]
    done = run("plan", "--root", str(EXAMPLES / "ct200"), *argv)
    error = json.loads(done.stdout)["error"]
    assert done.returncode == 9 and error["kind"] == "PlanRefusedError" and error["fix"]


def test_a_mistyped_option_with_json_is_a_json_error_document_too() -> None:
    done = run("plan", "--root", str(EXAMPLES / "ct200"), "--lxc", "200", "--bogus", "--json")
    error = json.loads(done.stdout)["error"]
    assert done.returncode == 2 == error["code"] and error["kind"] == "UsageError"
    assert "unrecognized arguments: --bogus" in error["message"]
    assert done.stderr.startswith("usage: ") and "proxgpu: unrecognized" in done.stderr
    assert run("plan", "--bogus", "--detailed-exitcode").returncode == 1, "2 means changes"


def test_a_missing_guest_config_names_the_host_the_file_and_the_fix() -> None:
    done = run("plan", "--root", str(EXAMPLES / "ct200"), "--lxc", "200", "--vm", "301", "--json")
    error = json.loads(done.stdout)["error"]
    assert done.returncode == 16 and error["kind"] == "RenderError"
    assert error["host"] == f"dir:{EXAMPLES / 'ct200'}"
    assert error["path"] == "/etc/pve/qemu-server/301.conf"
    assert error["fix"] == "create the VM first (`qm create`) or name one that exists (300)"
    assert error["fix"] in error["message"] and done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "env", "coloured"),
    [
        (["--color", "always"], {}, True),
        (["--color", "always"], {"NO_COLOR": "1"}, True),  # an explicit choice wins
        (["--color", "never"], {}, False),
        ([], {}, False),  # not a terminal
    ],
)
def test_colour_only_where_asked(flags: list[str], env: dict[str, str], coloured: bool) -> None:
    done = run("plan", "--root", str(EXAMPLES / "ct200"), *SPLIT, *flags, env=env)
    assert done.returncode == 0
    assert ("\x1b[" in done.stdout) is coloured


def test_verbose_says_what_runs_and_quiet_says_nothing_more() -> None:
    loud = run("inspect", "--root", str(EXAMPLES / "ct200"), "-v")
    assert "gather.sh" in loud.stderr and " s" in loud.stderr
    quiet = run("inspect", "--root", str(EXAMPLES / "ct200"), "-q")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_saved_plan_applies_exactly_and_refuses_a_changed_file(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    saved = tmp_path / "plan.json"
    assert main(["plan", "--root", str(root), *SPLIT, "--out", str(saved)]) == 0
    assert saved.stat().st_mode & 0o777 == 0o600, "it holds guest configs: owner only"
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "tags: edited-since\n")
    assert main(["apply", "--root", str(root), "--plan", str(saved), "--yes"]) == 10
    vm.write_text(vm.read_text().replace("tags: edited-since\n", ""))
    assert main(["apply", "--root", str(root), "--plan", str(saved), "--yes"]) == 0
    assert "hostpci0" in vm.read_text()


def test_a_saved_plan_is_for_its_host_only_and_must_be_intact(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    other = copy_example(tmp_path, dest="other")
    saved = tmp_path / "plan.json"
    assert main(["plan", "--root", str(root), *SPLIT, "--out", str(saved)]) == 0
    assert main(["apply", "--root", str(other), "--plan", str(saved), "--yes"]) == 2
    document = json.loads(saved.read_text())
    edited = next(f for f in document["changes"]["files"] if f["before"] is not None)
    edited["before"] += "tampered\n"
    saved.write_text(json.dumps(document))
    assert main(["apply", "--root", str(root), "--plan", str(saved), "--yes"]) == 2


def test_after_the_apply_a_pending_reboot_is_not_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    assert main(["apply", "--root", str(root), *SPLIT, "--yes"]) == 0
    capsys.readouterr()
    # No file changes are left, but the drivers change only at the next boot: still pending.
    assert main(["plan", "--root", str(root), *SPLIT, "--detailed-exitcode"]) == 2
    assert "Reboot pending" in capsys.readouterr().out
    assert main(["verify", "--root", str(root)]) == 0
    assert "a reboot is pending" in capsys.readouterr().out
    assert main(["verify", "--root", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not report["drifted"] and report["pending_reboot"]


def test_apply_dry_run_has_terraforms_exit_codes_and_sees_a_held_lock(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    args = ["apply", "--root", str(root), *SPLIT, "--dry-run", "--detailed-exitcode"]
    assert main(args) == 2
    lock = root / "run/lock/proxgpu"
    lock.mkdir(parents=True)
    (lock / "owner").write_text("id=1\nop=apply\nclient=elsewhere\npid=1\n")
    assert main(["apply", "--root", str(root), *SPLIT, "--dry-run"]) == 11


@pytest.mark.parametrize(("gpus", "code"), [("0,1,2,3", 0), ("1,2,3,4", 18)])
def test_check_gpus_tells_straddling_by_its_own_code(gpus: str, code: int) -> None:
    assert main(["check-gpus", gpus, "--root", str(EXAMPLES / "ct200")]) == code


def test_check_gpus_says_when_it_cannot_tell(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    (root / "sys/bus/pci/devices/0000:11:00.0/numa_node").write_text("-1\n")
    assert main(["check-gpus", "0,1", "--root", str(root)]) == 19


def test_on_a_host_of_one_numa_node_every_gpu_is_on_it() -> None:
    # single-socket's firmware gives its GPUs numa_node -1, as run places them: on node 0.
    assert main(["check-gpus", "0,1", "--root", str(EXAMPLES / "single-socket")]) == 0


def test_rollback_without_a_terminal_says_how_to_go_ahead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    done = run("rollback", "--root", str(root))
    assert done.returncode == 2
    assert done.stderr == "proxgpu: not on a terminal: pass --yes to roll back without asking\n"


def test_rollback_dry_run_shows_the_diff_asks_nothing_and_writes_nothing(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "cipassword: $5$secret-hash\n")
    assert run("apply", "--root", str(root), *SPLIT, "--yes").returncode == 0
    applied = vm.read_text()
    done = run("rollback", "--root", str(root), "--dry-run")  # no terminal, no --yes: no prompt
    assert done.returncode == 0, done.stderr
    assert vm.read_text() == applied, "a dry run writes nothing"
    # The diff goes from now to what the rollback leaves: the apply's hostpci lines removed.
    assert "-hostpci0: 0000:81:00,pcie=1" in done.stdout
    assert "secret-hash" not in done.stdout and "reboot required" in done.stdout
    assert "would restore" in done.stdout
    document = json.loads(run("rollback", "--root", str(root), "--dry-run", "--json").stdout)
    assert document["preview"]["reboot_required"] is True
    assert "secret-hash" not in json.dumps(document)
    history = json.loads(run("history", "--root", str(root), "--json").stdout)
    assert [entry["status"] for entry in history] == ["applied"]


def test_progress_says_how_long_each_step_has_taken(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    done = run("apply", "--root", str(root), *SPLIT, "--yes")
    steps = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert steps and all(
        line[1:].split("s]")[0].strip().replace(".", "").isdigit() for line in steps
    )


def test_root_given_twice_is_refused_not_half_used(capsys: pytest.CaptureFixture[str]) -> None:
    ct200, other = str(EXAMPLES / "ct200"), str(EXAMPLES / "single-socket")
    assert main(["inspect", "--root", ct200, "--root", other]) == 2
    assert "--root takes one DIR, given twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["inspect"], ["plan", *SPLIT], ["snapshot", "-o", "out"], ["history"]]
)
def test_a_cluster_snapshot_without_cluster_says_to_add_it_or_name_a_node(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = EXAMPLES / "cluster-3"
    assert main([*command, "--root", str(snapshot)]) == 2, "a usage error, as --root twice"
    err = capsys.readouterr().err
    assert err == (
        f"proxgpu: {snapshot}: a cluster snapshot (nodes pve1, pve2, pve3): add --cluster, "
        f"or name one node's tree (--root {snapshot / 'pve1'})\n"
    )


def test_one_node_of_a_cluster_snapshot_and_the_whole_with_cluster_still_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    snapshot = EXAMPLES / "cluster-3"
    assert main(["inspect", "--root", str(snapshot / "pve1")]) == 0
    assert main(["inspect", "--cluster", "--root", str(snapshot)]) == 0
    assert "a cluster snapshot" not in capsys.readouterr().err


def test_vv_says_each_exchange_each_file_read_and_the_time_v_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "cipassword: $5$hunter2\n")
    assert main(["plan", "--root", str(root), *SPLIT, "-v"]) == 0
    once = capsys.readouterr().err.splitlines()
    assert any("gather.sh (1 args" in line for line in once), "-v as before"
    assert not any(": ran " in line or ": read /" in line for line in once)
    assert main(["plan", "--root", str(root), *SPLIT, "-vv"]) == 0
    twice = capsys.readouterr().err.splitlines()
    assert any("gather.sh (1 args" in line for line in twice), "and what -v says"
    ran = [line for line in twice if ": ran sh -c <script: " in line]
    assert ran and all(" bytes in, " in line and line.endswith(" s") for line in ran)
    assert any(
        line.endswith(
            ": read /etc/pve/qemu-server/300.conf (" + str(len(vm.read_text())) + " bytes)"
        )
        for line in twice
    )
    assert twice[-1].startswith("proxgpu: plan took ")
    assert "hunter2" not in "\n".join(twice), "no secret reaches the log"


def test_every_message_spells_the_host_as_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planner's refusals once named the host by its own hostname (ct200), the renderer's
    and the host's errors by the target given (dir:TREE): one run, two spellings."""
    root = copy_example(tmp_path)
    given = f"dir:{root}"
    refused = ["plan", "--root", str(root), "--lxc", "201", "--vm", "300", "--json"]
    missing = ["plan", "--root", str(root), "--lxc", "200", "--vm", "301", "--json"]
    wrong_gpu = ["check-gpus", "0000:99:00.0", "--root", str(root), "--json"]
    too_many = ["run", "--tp", "9", "--root", str(root), "--json", "--", "true"]
    for argv in (refused, missing, wrong_gpu, too_many):
        assert main(argv) in (2, 9, 16), argv
        out, err = capsys.readouterr()
        error = json.loads(out)["error"]
        assert given in error["message"] and given in err, (argv, error["message"])
        assert "ct200:" not in error["message"].replace(f"{root}:", ""), error["message"]
        assert error["host"] in (given, None), argv


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--root", str(EXAMPLES / "ct200"), "--lxc", "200", "--json"],
        ["plan", "--root", str(EXAMPLES / "ct200"), "--lxc", "999", "--json"],
        ["plan", "--root", str(EXAMPLES / "ct200"), "--lxc", "200", "--bogus", "--json"],
    ],
    ids=["success", "error", "usage-error"],
)
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_a_reader_gone_early_ends_quietly_with_141(argv: list[str], unbuffered: str) -> None:
    """``proxgpu ... | head``: the reader closes the pipe before proxgpu writes. Whether the
    command succeeded or failed, it stops with 141 and says at most its one line on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    read, write = os.pipe()
    os.close(read)  # a real pipe whose reader is gone: every write to it fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "proxgpu", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 141, done.stderr
    assert done.stderr.count("\n") <= 2, done.stderr  # usage errors add their usage line
