"""The command line as a user runs it, in process (proxgpu.cli.main): output and exit codes."""

from __future__ import annotations

import gc
import json
import shlex
import sys
from pathlib import Path

import pytest

from proxgpu.cli import entry, main
from tests.support.trees import EXAMPLES, copy_example, snapshot

CT200 = str(EXAMPLES / "ct200")


def test_inspect_groups_gpus_by_numa_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--root", CT200]) == 0
    out = capsys.readouterr().out
    node0, node1 = out.index("NUMA node 0: CPUs 0-31"), out.index("NUMA node 1: CPUs 32-63")
    assert node0 < out.index("0000:71:00.0") < node1 < out.index("0000:81:00.0")
    assert "/dev/nvidia4" in out[node1:]
    assert "Proxmox VE 8.4.1" in out and "systemd-boot" in out


def test_a_gpu_whose_model_is_unknown_is_named_by_its_ids_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Neither pci.ids nor NVIDIA's information files name the model: the inventory's text, its
    tree and the plan's table all name the GPU by its vendor:device IDs (the plan said "?")."""
    root = copy_example(tmp_path)
    (root / "usr/share/misc/pci.ids").unlink()
    for info in (root / "proc/driver/nvidia/gpus").glob("*/information"):
        lines = info.read_text().splitlines(keepends=True)
        info.write_text("".join(line for line in lines if not line.startswith("Model:")))
    for argv in (["inspect"], ["inspect", "--tree"], ["plan", "--lxc", "200"]):
        assert main([*argv, "--root", str(root)]) == 0
        out = capsys.readouterr().out
        rows = [line for line in out.splitlines() if "0000:81:00.0" in line]
        assert rows and any("10de:2bb1" in row for row in rows), (argv, rows)
        assert "NVIDIA RTX PRO 6000" not in out


def test_inspect_json_is_the_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--root", CT200, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hostname"] == "ct200"
    assert [g["nvidia_minor"] for g in data["gpus"]] == list(range(8))


def test_gpu_vendor_option_filters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--root", CT200, "--json", "--gpu-vendor", "0x1002"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == []


def test_snapshot_then_inspect_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "snap"
    assert main(["snapshot", "--root", CT200, "-o", str(out)]) == 0
    assert f"proxgpu inspect --root {out}" in capsys.readouterr().out
    assert main(["inspect", "--root", str(out), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 8


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["inspect", "--root", "/no/such/dir"], 2, "/no/such/dir: no such directory"),
        (["inspect", "--root", "/proc/self/fdinfo"], 8, "no PCI devices found"),
        (["inspect", "--host", "a:b"], 2, "port 'b' is not a number"),
        (["inspect", "--root", __file__], 2, f"{__file__}: not a directory (--root names"),
        # Every form --lxc takes, the MIG instance's too.
        (
            ["plan", "--root", CT200, "--lxc", "abc"],
            2,
            "container 'abc': expected VMID or VMID:N (N GPUs, at least 1), either one with "
            "@NODE, or VMID:mig=GPU/GI[/CI] (a MIG instance)",
        ),
        (
            ["check-gpus", "--root", CT200, "0,x"],
            2,
            f"GPU 'x': neither a CUDA index nor a PCI address on dir:{CT200} (CUDA numbers 0-7 "
            "there)",
        ),
    ],
)
def test_errors_are_one_line_with_a_kind_specific_exit_code(
    argv: list[str], code: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_plan_json_says_how_the_tensor_parallel_indexes_are_numbered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--root", CT200, "--lxc", "200", "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)["tensor_parallel"]
    assert advice and {a["ordering"] for a in advice} == {"CUDA_DEVICE_ORDER=PCI_BUS_ID"}


@pytest.mark.parametrize(
    ("guests", "missing"),
    [
        # Alone, CT 999 would get node 0's GPUs and CT 200 lose node 1's to vfio-pci: a refusal
        # (exit 9) about CT 200 that says nothing of the VMID mistyped.
        (["--lxc", "999"], "/etc/pve/lxc/999.conf: no such container config"),
        (
            ["--lxc", "200", "--vm", "998", "--mapping", "9-gpus"],  # a name Proxmox refuses
            "/etc/pve/qemu-server/998.conf: no such VM config",
        ),
    ],
)
def test_a_guest_that_does_not_exist_is_said_before_any_refusal(
    guests: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--root", CT200, *guests]) == 16
    err = capsys.readouterr().err
    assert missing in err and "plan refused" not in err


def test_snapshot_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x").write_text("keep")
    assert main(["snapshot", "--root", CT200, "-o", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_an_internal_error_is_one_line_unless_debugging(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_args: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr("proxgpu.cli.inspecting.inspect", broken)
    assert main(["inspect", "--root", CT200]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err and "PROXGPU_DEBUG" in err
    monkeypatch.setenv("PROXGPU_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["inspect", "--root", CT200])


def test_inspect_json_never_shows_password_hashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "cipassword: $5$salt$hash\n")
    assert main(["inspect", "--root", str(root), "--json"]) == 0
    out = capsys.readouterr().out
    assert "$5$salt" not in out and "cipassword: <redacted by proxgpu>" in out


def test_detailed_exitcode_keeps_2_for_changes_only(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--root", CT200, "--lxc", "200", "--vm", "300", "--detailed-exitcode"]
    assert main(base) == 2
    assert main([*base, "--bind-method", "nonsense"]) == 1, "a usage error is an error"
    refused = [*base[:3], "--lxc", "201", "--vm", "300", "--detailed-exitcode"]
    assert main(refused) == 1, "a refused plan is an error"
    capsys.readouterr()


def test_apply_json_must_not_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["apply", "--root", CT200, "--lxc", "200", "--json"]) == 2
    assert "add --yes or --dry-run" in capsys.readouterr().err


def test_apply_twice_says_no_changes_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(copy_example(tmp_path))
    args = ["apply", "--root", root, "--lxc", "200", "--vm", "300", "--yes"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("already matches the plan") == 1


def test_a_saved_plan_applied_again_says_nothing_to_do_in_text_as_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, saved = str(copy_example(tmp_path)), str(tmp_path / "plan.json")
    assert main(["plan", "--root", root, "--lxc", "200", "--vm", "300", "--out", saved]) == 0
    again = ["apply", "--root", root, "--plan", saved, "--yes", "--trust-unsigned"]
    assert main(again) == 0
    capsys.readouterr()
    assert main(again) == 0
    text = capsys.readouterr().out
    assert text.endswith("nothing to do: the host already matches the plan\n"), text[-300:]
    assert main([*again, "--json"]) == 0
    messages = json.loads(capsys.readouterr().out)["result"]["messages"]
    assert messages == ["nothing to do: the host already matches the plan"]


@pytest.mark.parametrize(
    "beside",
    [["--vm", "301"], ["--split", "numa", "--host-node", "1"], ["--bind-method", "driverctl"]],
)
def test_a_split_option_beside_a_saved_plan_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], beside: list[str]
) -> None:
    """The saved plan is the whole request (as Terraform's saved plan is): an option that would
    change the split is named in the refusal, and nothing is written."""
    root = copy_example(tmp_path)
    saved = str(tmp_path / "plan.json")
    assert main(["plan", "--root", str(root), "--lxc", "200", "--out", saved]) == 0
    before = snapshot(root)
    capsys.readouterr()
    argv = ["apply", "--root", str(root), "--plan", saved, *beside, "--yes", "--trust-unsigned"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    given = [option for option in beside if option.startswith("--") and option != "--split"]
    assert f"is the whole request, so {', '.join(given)} would be ignored" in err, err
    assert snapshot(root) == before


def test_quiet_apply_and_rollback_say_nothing_when_nothing_goes_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-q: only what went wrong. Without it both say what they did."""
    root = str(copy_example(tmp_path))
    before = snapshot(Path(root))
    assert main(["apply", "--root", root, "--lxc", "200", "--yes", "-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert snapshot(Path(root)) != before
    assert main(["rollback", "--root", root, "--yes", "-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert snapshot(Path(root)) == before
    assert main(["apply", "--root", root, "--lxc", "200", "--yes"]) == 0
    assert main(["rollback", "--root", root, "--yes"]) == 0
    out, err = capsys.readouterr()
    assert "files restored from journal entry" in out and "preflight" in err


def test_the_plan_says_the_command_that_applies_it_on_the_same_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last line of a plan is the apply command with the same host and split options; run
    as it stands, it applies that plan (a plan after it has nothing left to do). Saved with
    --out, the command applies the file on the same host."""
    root = str(copy_example(tmp_path))
    argv = ["plan", "--root", root, "--lxc", "200", "--vm", "300:2", "--gpu-vendor", "10de"]
    assert main(argv) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("Apply it with `proxgpu apply --root ") and said.endswith("`.")
    command = shlex.split(said.removeprefix("Apply it with `").removesuffix("`."))
    assert command[:2] == ["proxgpu", "apply"]
    assert main([*command[1:], "--yes", "-q"]) == 0
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"]["changed"] is False, "all applied"
    saved = str(tmp_path / "saved.json")
    assert main(["plan", "--root", root, "--lxc", "200", "--out", saved]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(f"`{shlex.join(['proxgpu', 'apply', '--root', root, '--plan', saved])}`.")


def test_what_asks_nothing_of_the_admin_is_a_note_not_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan of ct200 whose initramfs was not read, with an uneven split: those are notes
    (in the text and in --json), while what asks something (restart the changed guests) stays
    a warning."""
    root = str(copy_example(tmp_path))
    argv = ["plan", "--root", root, "--lxc", "200", "--vm", "300", "--host-gpus", "01:00.0"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "\nnote: the initramfs of 6.8.12-11-pve was not read" in text
    assert "  note: uneven split: 1 GPU on the host driver, 7 GPUs on vfio-pci" in text
    assert "\nwarning: restart the changed guests to apply their new config" in text
    assert not [line for line in text.splitlines() if "warning:" in line and "initramfs" in line]
    assert main([*argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert any(note.startswith("uneven split") for note in document["notes"])
    assert any(note.startswith("the initramfs") for note in document["changes"]["notes"])
    assert not any("initramfs" in warning for warning in document["changes"]["warnings"])


def test_the_installed_command_leaves_what_it_made_to_the_process_end(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``entry`` (the console script, ``python -m proxgpu``) returns main's exit code with every
    object it made frozen out of the collector's way; ``main`` alone leaves the collector be."""
    monkeypatch.setattr("sys.argv", ["proxgpu", "inspect", "--root", CT200, "--json"])
    assert main(sys.argv[1:]) == 0 and gc.get_freeze_count() == 0
    try:
        assert entry() == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert json.loads(capsys.readouterr().out.split("\n}\n", 1)[1])["hostname"] == "ct200"


def test_a_vm_given_more_gpus_than_hostpci_entries_is_a_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Proxmox takes hostpci0 to hostpci15: a VM with 13 other devices has room for 3 GPUs,
    and a plan that gives it 4 is refused, naming the count and the way out."""
    root = copy_example(tmp_path)
    vm = root / "etc/pve/qemu-server/300.conf"
    others = "".join(f"hostpci{i}: 0000:{0x20 + i:02x}:00.0\n" for i in range(13))
    vm.write_text(vm.read_text() + others)
    assert main(["plan", "--root", str(root), "--lxc", "200", "--vm", "300"]) == 9
    err = capsys.readouterr().err
    assert (
        "VM 300 would need 17 hostpci entries (4 GPUs and the 13 it has for other devices), "
        "but Proxmox takes hostpci0 to hostpci15"
    ) in err
    assert "give VM 300 at most 3 GPUs (--vm 300:3)" in err
    assert main(["plan", "--root", str(root), "--lxc", "200", "--vm", "300:3"]) == 0


@pytest.mark.parametrize("name", ["..", "a..b"])
def test_a_host_name_with_an_empty_label_does_not_resolve(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name the IDNA codec refuses before any lookup is a name that does not resolve (exit 3),
    as OpenSSH says of it, not an internal error."""
    config = tmp_path / "ssh_config"
    config.touch()
    assert main(["inspect", "--host", name, "--ssh-config", str(config)]) == 3
    assert capsys.readouterr().err == f"proxgpu: {name}: cannot connect: name does not resolve\n"
