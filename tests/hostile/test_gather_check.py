"""A tree on another host is checked by the gather script itself, in the same run: every file
read through a link out of the tree is dropped and named, every other one keeps its mode, just
as this machine's own check finds (issue 22, point 6: one round trip per tree).

The other host is a :class:`~proxgpu.host.CommandHost` whose connection is a real ``sh`` on this
machine: the scripts run as they run over SSH, and each command is counted."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from proxgpu.errors import CommandError
from proxgpu.host import DirectoryHost
from proxgpu.host.command import CommandHost
from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import Capture, gather
from proxgpu.inspection.recognition import GpuFilter
from proxgpu.paths import CAPTURED_DIR, NVIDIA_SMI_LIST
from tests.support.hostile import Scene, scene
from tests.support.trees import copy_example, sriov_tree

VM = "etc/pve/qemu-server/300.conf"
MODULES = "etc/modules"
CAPTURED = CAPTURED_DIR.strip("/")
#: What the gather script runs (dd: the bulk output's blocks; timeout and head: the bound on
#: each command), realpath aside.
TOOLS = (
    "sh",
    "grep",
    "find",
    "awk",
    "xargs",
    "tar",
    "base64",
    "stat",
    "id",
    "dd",
    "timeout",
    "head",
)


class Shell:
    """Runs each command line with ``sh -c`` here, counting them; with ``path``, with only the
    tools in that folder (see :func:`_tools`)."""

    def __init__(self, path: Path | None = None) -> None:
        self.commands = 0
        self.env = None if path is None else {"PATH": str(path)}

    def __call__(self, command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
        self.commands += 1
        done = subprocess.run(
            ["sh", "-c", command], input=stdin, capture_output=True, env=self.env, check=False
        )
        return done.returncode, done.stdout, done.stderr


def _tools(folder: Path, tools: tuple[str, ...], scripts: dict[str, str] | None = None) -> Path:
    """``folder`` as a PATH holding the real ``tools`` and, in place of some, the shell
    ``scripts`` by name (each may run the real tool, whose path ``{real}`` stands for)."""
    folder.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found is not None, tool
        script = (scripts or {}).get(tool)
        if script is None:
            (folder / tool).symlink_to(found)
        else:
            (folder / tool).write_text("#!/bin/sh\n" + script.replace("{real}", found))
            (folder / tool).chmod(0o755)
    return folder


def both(hostile: Scene, *, modes: bool = False) -> tuple[Capture, Capture, int]:
    """The tree gathered through the script's check and through this machine's, and how many
    commands the first took."""
    shell = Shell()
    remote = gather(CommandHost("pve1", shell, root=str(hostile.tree)), modes=modes)
    local = gather(DirectoryHost(str(hostile.tree)), modes=modes)
    return remote, local, shell.commands


def test_a_tree_with_links_out_is_checked_in_the_gathers_own_run(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    victim = hostile.victim("shadow", b"root:$6$outside-hash:19000::::::\n")
    (hostile.tree / VM).unlink()
    (hostile.tree / VM).symlink_to(victim)
    target = hostile.link_out("etc/modprobe.d")
    (target / "evil.conf").write_text("options secret-from-outside 1\n")
    (hostile.tree / "etc/pve/lxc/200.conf").chmod(0o640)
    hostile.settle()
    remote, local, commands = both(hostile, modes=True)
    assert commands == 1, "gather and check are one round trip"
    assert remote.outside.keys() == local.outside.keys()
    assert remote.outside[f"/{VM}"] == str(victim)
    # A file in a directory linked out is named by where the directory leads.
    assert remote.outside["/etc/modprobe.d/evil.conf"] == str(target)
    assert f"/{VM}" not in remote.raw and "/etc/modprobe.d/evil.conf" not in remote.raw
    assert remote.modes == local.modes
    assert remote.modes["/etc/pve/lxc/200.conf"] == 0o640
    assert remote.raw == local.raw and remote.lines == local.lines
    hostile.assert_outside_unchanged()


def test_a_sysfs_file_linked_out_of_the_tree_is_dropped_not_read(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    victim = hostile.victim("cmdline", b"secret-from-outside\n", mode=0o644)
    (hostile.tree / "proc/cmdline").unlink()
    (hostile.tree / "proc/cmdline").symlink_to(victim)
    remote, local, _ = both(hostile, modes=True)
    assert "/proc/cmdline" not in remote.lines
    assert remote.outside == local.outside == {"/proc/cmdline": str(victim)}
    assert "/proc/cmdline" not in remote.modes
    assert remote.modes == local.modes
    hostile.assert_outside_unchanged()


def test_a_file_whose_name_holds_a_tab_is_dropped_as_a_bad_name(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    node = hostile.tree / "sys/devices/system/node"
    (node / "node\tx").mkdir()
    (node / "node\tx/cpulist").write_text("0-3\n")
    remote, local, _ = both(hostile)
    name = "/sys/devices/system/node/node\tx/cpulist"
    assert name in local.lines, "this machine's check can look at it"
    assert name not in remote.lines and name in remote.bad_names
    hostile.assert_outside_unchanged()


def test_a_check_cut_short_is_an_error_not_a_tree_taken_as_inside(tmp_path: Path) -> None:
    hostile = scene(tmp_path)

    # A PATH with every tool the gather uses but realpath: no path on the way is resolved.
    no_realpath = Shell(_tools(tmp_path / "bin", TOOLS))
    with pytest.raises(CommandError, match="looking where each file is"):
        gather(CommandHost("pve1", no_realpath, root=str(hostile.tree)))


def test_a_snapshot_copy_keeps_the_modes_the_script_found(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    (hostile.tree / MODULES).chmod(0o600)
    remote, _, _ = both(hostile, modes=True)
    assert stat.S_IMODE((hostile.tree / MODULES).stat().st_mode) == remote.modes[f"/{MODULES}"]


def test_thousands_of_functions_are_checked_by_a_few_commands_not_one_per_directory(
    tmp_path: Path,
) -> None:
    """6000 SR-IOV functions' 54000 files, in 6000 directories, each reached through its
    device link: the script's check says what this machine's says, with one realpath and one
    stat per batch of names (xargs fits about two thousand in one), not a stat per directory."""
    tree = sriov_tree(tmp_path, 6000)
    log = tmp_path / "tools.log"
    tools = (*TOOLS, "realpath")
    counting = {tool: f'echo {tool} >>"{log}"\nexec {{real}} "$@"\n' for tool in tools}
    shell = Shell(_tools(tmp_path / "counting-bin", tools, counting))
    remote = gather(CommandHost("pve1", shell, root=str(tree)), modes=True)
    local = gather(DirectoryHost(str(tree)), modes=True)
    assert len(remote.modes) > 54000
    assert remote.modes == local.modes and remote.outside == local.outside == {}
    ran = log.read_text().split()
    per_batch = len(remote.modes) // 1000
    assert 1 <= ran.count("stat") <= per_batch and 1 <= ran.count("realpath") <= per_batch


def test_a_check_whose_paths_are_not_all_resolved_is_no_check(tmp_path: Path) -> None:
    """The check pairs each path with realpath's line of the same rank: a realpath that answers
    one line short (a stand-in, as no real one fails that way on a tree this machine can make)
    must fail the gather, not shift every verdict by one."""
    hostile = scene(tmp_path)
    one_short = {"realpath": '{real} "$@" | tail -n +2\n'}
    short = Shell(_tools(tmp_path / "short-bin", (*TOOLS, "realpath", "tail"), one_short))
    with pytest.raises(CommandError, match="looking where each file is"):
        gather(CommandHost("pve1", short, root=str(hostile.tree)))


@pytest.mark.parametrize("linked", ["file", "directory"])
def test_nvidia_smi_s_kept_outputs_are_never_read_through_a_link_out(
    tmp_path: Path, linked: str
) -> None:
    """A snapshot's kept nvidia-smi output (or its folder) linked to a file outside is never
    read: the MIG devices' UUIDs are then unknown, on this machine's tree and another's."""
    hostile = scene(tmp_path, "mig")
    kept = hostile.tree / NVIDIA_SMI_LIST.lstrip("/")
    forged = kept.read_text().replace("02000000c7a2", "0200000bad00")
    if linked == "file":
        victim = hostile.victim("listing", forged.encode(), mode=0o644)
        kept.unlink()
        kept.symlink_to(victim)
    else:
        (hostile.link_out(CAPTURED) / kept.name).write_text(forged)
    hostile.settle()
    for host in (
        DirectoryHost(str(hostile.tree)),
        CommandHost("pve1", Shell(), root=str(hostile.tree)),
    ):
        capture = gather(host)
        assert NVIDIA_SMI_LIST not in capture.raw
        inventory = build_inventory(capture, "pve1", GpuFilter())
        uuids = [i.uuid for i in inventory.gpu("0000:18:00.0").mig_instances]
        assert uuids == [None] * 4, "no UUID is believed from outside the tree"
    hostile.assert_outside_unchanged()


def test_module_aliases_linked_out_of_the_tree_are_dropped_not_believed(tmp_path: Path) -> None:
    """The kernels' alias lists are read in the same pass as the sysfs files and checked with
    them: one reached through a link out of the tree is dropped and named, never a module's
    alias (nor its name, which would go into proxgpu's modprobe.d file)."""
    hostile = scene(tmp_path)
    directory = "lib/modules/6.8.12-11-pve"
    aliases = b"alias pci:v000010DEd*sv*sd*bc03sc*i* from_outside\n"
    victims = {
        f"{directory}/modules.alias": hostile.victim("modules.alias", aliases, mode=0o644),
        f"{directory}/modules.builtin.modinfo": hostile.victim(
            "modinfo", b"from_outside.alias=pci:v000010DEd*\0", mode=0o644
        ),
    }
    for path, victim in victims.items():
        (hostile.tree / path).unlink()
        (hostile.tree / path).symlink_to(victim)
    hostile.settle()
    remote, local, _ = both(hostile, modes=True)
    named = {f"/{path}": str(victim) for path, victim in victims.items()}
    assert remote.outside == local.outside == named
    assert not any(path in remote.lines or path in local.lines for path in named)
    assert remote.modes == local.modes
    hostile.assert_outside_unchanged()


def test_configs_of_many_directories_are_read_whole_by_two_tars(tmp_path: Path) -> None:
    """A tree with a config in each of eleven directories: each read byte for byte through the
    directory the script entered, seven directories to a tar (the descriptors a shell can
    name), so two tars in all, not one per directory."""
    tree = tmp_path / "host"
    written = {}
    for at in (
        "etc/modprobe.d/a.conf",
        "run/modprobe.d/b.conf",
        "usr/local/lib/modprobe.d/c.conf",
        "usr/lib/modprobe.d/d.conf",
        "lib/modprobe.d/e.conf",
        "etc/modules-load.d/f.conf",
        "etc/default/grub.d/g.cfg",
        "etc/kernel/cmdline",
        "etc/driverctl.d/0000:81:00.0",
        "etc/proxgpu/h",
        "etc/systemd/system/pve-guests.service.d/proxgpu.conf",
    ):
        path = tree / at
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"# {at}\n\x00\xff no newline at the end".encode("latin-1"))
        written["/" + at] = path.read_bytes()
    log = tmp_path / "tools.log"
    counting = {"tar": f'echo tar >>"{log}"\nexec {{real}} "$@"\n'}
    shell = Shell(_tools(tmp_path / "counting-bin", (*TOOLS, "realpath"), counting))
    remote = gather(CommandHost("pve1", shell, root=str(tree)))
    assert {path: remote.raw.get(path) for path in written} == written
    assert log.read_text().split() == ["tar", "tar"]


def test_a_file_gone_after_the_look_leaves_the_others_read(tmp_path: Path) -> None:
    """One awk reads pci.ids, the module aliases and dpkg's status, each by getline: pci.ids
    removed between the look and the reading (by a grep that runs before the awk reads it)
    gives no names, and the built-in modules' aliases and pve-container's version are still
    read, not lost with the run of a failed file operand."""
    tree = copy_example(tmp_path, dest="host")
    kernel = tree / "lib/modules/6.8.12-11-pve"
    (kernel / "modules.builtin.modinfo").write_bytes(
        b"nvme.alias=pci:v*d*sv*sd*bc01sc08i02*\0vfio_pci.alias=pci:v000010DEd*sv*sd*bc*sc*i*\0"
    )
    dpkg = tree / "var/lib/dpkg/status"
    dpkg.parent.mkdir(parents=True)
    dpkg.write_text("Package: pve-container\nStatus: install ok installed\nVersion: 6.0.9\n\n")
    pci_ids = tree / "usr/share/misc/pci.ids"
    remove = f'case "$*" in *"^alias "*) rm -f "{pci_ids}" ;; esac\n'
    removing = {"grep": remove + 'exec {real} "$@"\n'}
    shell = Shell(_tools(tmp_path / "bin", (*TOOLS, "realpath", "rm"), removing))
    capture = gather(CommandHost("pve1", shell, root=str(tree)))
    assert not pci_ids.exists() and "/usr/share/misc/pci.ids" not in capture.lines
    builtin = capture.lines["/lib/modules/6.8.12-11-pve/modules.builtin.modinfo"]
    assert "vfio_pci.alias=pci:v000010DEd*sv*sd*bc*sc*i*" in builtin
    assert capture.lines["/var/lib/dpkg/status"][-1] == "Version: 6.0.9"
