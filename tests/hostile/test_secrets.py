"""Secrets stay home: what ``plan`` redacts is redacted everywhere proxgpu shows host data, and a
tree's link out of it is never followed to copy or print (issue 21, point 5).

Each case runs the command line in process on a copy of the ct200 example in a scratch folder
whose VM config carries cloud-init's password hash and a QEMU secret in ``args:``, and asserts
the exact redacted text, that no secret reaches stdout, stderr or a written file, and that
nothing outside the scratch folder changed.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.errors import SysfsError
from proxgpu.redact import REDACTED
from tests.support.hostile import Scene, scene

SPLIT = ["--lxc", "200", "--vm", "300"]
VM = "etc/pve/qemu-server/300.conf"
PASSWORD = "$5$SALT$cloudinitpasswordhash"
QEMU_SECRET = "hunter2-qemu-secret"
SPICE = "spice-pass-77"
SECRETS = (PASSWORD, QEMU_SECRET, SPICE, "cloudinitpasswordhash")


def secret_scene(tmp_path: Path) -> Scene:
    """The ct200 tree with secrets in VM 300's config."""
    hostile = scene(tmp_path)
    config = hostile.tree / VM
    config.write_text(
        config.read_text()
        + f"cipassword: {PASSWORD}\n"
        + f"args: -object secret,id=s0,data={QEMU_SECRET} -spice port=5930,password={SPICE}\n"
    )
    hostile.settle()
    return hostile


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


REDACTED_ARGS = f"args: -object secret,id=s0,data={REDACTED} -spice port=5930,password={REDACTED}"


def test_plan_json_redacts_both_kinds_of_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = secret_scene(tmp_path)
    code, out, err = cli(capsys, "plan", "--root", str(hostile.tree), *SPLIT, "--json")
    assert code == 0, err
    assert_no_secret(out, err)
    files = json.loads(out)["changes"]["files"]
    vm = next(f for f in files if f["path"] == "/" + VM)
    assert f"cipassword: {REDACTED}\n" in vm["before"]
    assert REDACTED_ARGS + "\n" in vm["after"]
    hostile.assert_outside_unchanged()


def test_history_json_redacts_the_journal_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = secret_scene(tmp_path)
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    (entry,) = (hostile.tree / "var/lib/proxgpu/journal").glob("*.json")
    assert PASSWORD in entry.read_text(), "the journal on the host keeps the config whole"
    code, out, err = cli(capsys, "history", "--root", str(hostile.tree), "--json")
    assert code == 0, err
    assert_no_secret(out, err)
    (shown,) = json.loads(out)
    vm = next(f for f in shown["changeset"]["files"] if f["path"] == "/" + VM)
    assert f"cipassword: {REDACTED}\n" in vm["before"] and REDACTED_ARGS in vm["after"]
    hostile.assert_outside_unchanged()


def test_inspect_json_redacts_the_guest_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = secret_scene(tmp_path)
    code, out, err = cli(capsys, "inspect", "--root", str(hostile.tree), "--json")
    assert code == 0, err
    assert_no_secret(out, err)
    config = json.loads(out)["guest_configs"]["/" + VM]
    assert f"cipassword: {REDACTED}\n" in config and REDACTED_ARGS in config
    hostile.assert_outside_unchanged()


def test_the_html_report_redacts_every_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = secret_scene(tmp_path)
    report = hostile.scratch / "report.html"
    code, out, err = cli(capsys, "report", "--root", str(hostile.tree), *SPLIT, "-o", str(report))
    assert code == 0, err
    html = report.read_text()
    assert_no_secret(out, err, html)
    assert "cipassword: &lt;redacted by proxgpu&gt;" in html
    hostile.assert_outside_unchanged()


def test_apply_with_vv_logs_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = secret_scene(tmp_path)
    code, out, err = cli(capsys, "apply", "-vv", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    assert "stage.sh" in err, "-vv said what ran"
    assert_no_secret(out, err)
    hostile.assert_outside_unchanged()


def test_an_error_quoting_host_text_redacts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = secret_scene(tmp_path)
    error = SysfsError("pve1", "/" + VM, f"line 9: cipassword: {PASSWORD} cannot be read")
    assert str(error) == f"pve1: /{VM}: line 9: cipassword: {REDACTED}"
    argv = ["check-gpus", "--root", str(hostile.tree), f"cipassword: {PASSWORD}", "--json"]
    code, out, err = cli(capsys, *argv)
    assert code == 2
    assert_no_secret(out, err)
    assert json.loads(out)["error"]["message"] == f"GPU 'cipassword: {REDACTED}"
    hostile.assert_outside_unchanged()


# --- snapshot and inspect never follow a link out of the tree, and copy no mode wider ----------


def test_snapshot_redacts_and_keeps_each_files_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = secret_scene(tmp_path)
    (hostile.tree / VM).chmod(0o640)
    (hostile.tree / "etc/modules").chmod(0o600)
    out_dir = hostile.scratch / "snap"
    code, out, err = cli(capsys, "snapshot", "--root", str(hostile.tree), "-o", str(out_dir))
    assert code == 0, err
    copy = (out_dir / VM).read_text()
    assert_no_secret(out, err, copy)
    assert f"cipassword: {REDACTED}\n" in copy and REDACTED_ARGS in copy
    assert stat.S_IMODE((out_dir / VM).stat().st_mode) == 0o640
    assert stat.S_IMODE((out_dir / "etc/modules").stat().st_mode) == 0o600
    for path in out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            source = hostile.tree / path.relative_to(out_dir)
            if source.is_file():
                wider = stat.S_IMODE(path.stat().st_mode) & ~stat.S_IMODE(source.stat().st_mode)
                assert wider == 0, f"{path} is wider than {source}"
    hostile.assert_outside_unchanged()


def test_a_guest_config_linked_out_of_the_tree_is_neither_copied_nor_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    victim = hostile.victim("shadow", b"root:$6$outside-the-tree-hash:19000::::::\n")
    (hostile.tree / VM).unlink()
    (hostile.tree / VM).symlink_to(victim)
    out_dir = hostile.scratch / "snap"
    code, out, err = cli(capsys, "snapshot", "--root", str(hostile.tree), "-o", str(out_dir))
    assert code == 0, err
    assert not (out_dir / VM).exists()
    code, out, err = cli(capsys, "inspect", "--root", str(hostile.tree), "--json")
    assert code == 0, err
    for text in (out, err, *(p.read_text() for p in out_dir.rglob("*.conf") if p.is_file())):
        assert "outside-the-tree-hash" not in text
    assert (
        f"/{VM}: skipped, it leads out of the tree (to {victim}) through a symlink"
        in (json.loads(out)["warnings"])
    )
    hostile.assert_outside_unchanged()


def test_a_directory_linked_out_of_the_tree_is_not_read_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    target = hostile.link_out("etc/pve/lxc")
    (target / "999.conf").write_text("lxc.secret-from-outside: 1\n")
    hostile.settle()
    code, out, err = cli(capsys, "inspect", "--root", str(hostile.tree), "--json")
    assert code == 0, err
    assert "secret-from-outside" not in out + err
    assert "/etc/pve/lxc/999.conf" not in json.loads(out)["guest_configs"]
    hostile.assert_outside_unchanged()
