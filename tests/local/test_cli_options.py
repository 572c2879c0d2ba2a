"""The options keep git's and ssh's conventions: an option that takes one value takes it once, a
long option is its whole name, a command offers only the options it uses, and ``-o -`` is stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.cli.parser import build_parser, parser_for
from proxgpu.errors import UsageError
from tests.support.trees import EXAMPLES

CT200 = str(EXAMPLES / "ct200")
PLAN = ["plan", "--root", CT200]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([*PLAN, "--mapping", "a", "--mapping", "b"], "--mapping takes one NAME, given twice"),
        (
            [*PLAN, "--bind-method", "modprobe", "--bind-method", "driverctl"],
            "--bind-method takes one value, given twice",
        ),
        # The default (numa) is not a first value: given once it is accepted, twice not.
        ([*PLAN, "--split", "numa", "--split", "numa"], "--split takes one value, given twice"),
        (["inspect", "-o", "a", "--output", "b"], "--output takes one FILE, given twice"),
        (["run", "--tp", "1", "--tp", "2", "--", "true"], "--tp takes one N, given twice"),
    ],
)
def test_an_option_of_one_value_given_twice_is_a_usage_error(argv: list[str], said: str) -> None:
    with pytest.raises(UsageError, match=said):
        build_parser().parse_args(argv)


def test_lxc_repeats_for_containers_that_share_the_host_group() -> None:
    args = build_parser().parse_args([*PLAN, "--lxc", "200", "--lxc", "201:2"])
    assert args.lxc == ["200", "201:2"]
    assert build_parser().parse_args(PLAN).lxc == []


def test_an_option_given_once_keeps_its_value_and_its_default() -> None:
    args = build_parser().parse_args([*PLAN, "--bind-method", "driverctl", "--split", "numa"])
    assert (args.bind_method, args.split, args.mapping) == ("driverctl", "numa", None)
    assert build_parser().parse_args(PLAN).bind_method == "modprobe"


@pytest.mark.parametrize(
    "argv",
    [
        [*PLAN, "--lx", "200"],
        [*PLAN, "--bind", "driverctl"],
        ["inspect", "--roo", CT200],
        ["inspect", "--root", CT200, "--js"],
    ],
)
def test_an_abbreviated_long_option_is_refused(argv: list[str]) -> None:
    with pytest.raises(UsageError, match="unrecognized arguments"):
        build_parser().parse_args(argv)


def test_short_options_still_group() -> None:
    assert build_parser().parse_args(["inspect", "-vv", "-q"]).verbose == 2


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("inspect", "--parallel"),
        ("plan", "--parallel"),
        ("verify", "--parallel"),
        ("history", "--gpu-vendor"),
        ("history", "--gpu-class"),
        ("verify", "--gpu-vendor"),
        ("rollback", "--gpu-class"),
    ],
)
def test_an_option_the_command_does_not_use_is_not_offered(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UsageError, match=f"unrecognized arguments: {option}"):
        build_parser().parse_args([command, option, "1"])
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert option not in capsys.readouterr().out


def test_the_commands_that_use_them_still_offer_them() -> None:
    assert build_parser().parse_args(["apply", "--parallel", "3"]).parallel == 3
    assert build_parser().parse_args(["rollback", "--parallel", "2"]).parallel == 2
    assert build_parser().parse_args(["check-gpus", "0", "--gpu-vendor", "10de"]).gpu_vendor == [
        "10de"
    ]


def test_a_global_option_before_the_command_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match="unrecognized arguments: --json"):
        build_parser().parse_args(["--json", "inspect"])


# --- -o - ----------------------------------------------------------------------------------------


def test_report_dash_o_dash_writes_the_html_to_stdout_and_says_so_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["report", "--root", CT200, "--lxc", "200", "--vm", "300", "-o", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
    assert "wrote stdout: 1 of 1 hosts read" in err
    assert not (tmp_path / "-").exists() and not Path("-").exists()


def test_report_dash_o_dash_with_json_is_refused_before_reading_a_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["report", "--root", "/nonexistent", "-o", "-", "--json"]) == 2
    assert "leave out --json, or give -o FILE" in capsys.readouterr().err


def test_inspect_dash_o_dash_is_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--root", CT200, "--format", "svg", "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith("<?xml")
    assert not Path("-").exists()


def test_snapshot_dash_o_dash_says_a_snapshot_is_a_directory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["snapshot", "--root", CT200, "-o", "-"]) == 2
    assert "a snapshot is a directory tree, not a stream: -o DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "--root", CT200, "--json", "--tree"],
        ["snapshot", "--host", "pve1", "-o", "x"],
        [*PLAN, "--lxc", "200", "--vm", "300:2", "--split", "numa"],
        ["apply", "--host", "pve1,pve2", "--parallel", "2", "--yes"],
        ["verify", "--host", "pve1", "--json"],
        ["rollback", "--dry-run"],
        ["history", "--json"],
        ["check-gpus", "--lxc", "200"],
        ["run", "--tp", "2", "--", "nvidia-smi"],
        ["report", "-o", "-"],
        ["completion", "fish"],
        ["plan", "--lx", "200"],
        ["plan", "--split", "numa", "--split", "numa"],
        ["history", "--gpu", "0000:01:00.0"],
    ],
)
def test_a_command_parsed_by_its_own_options_reads_as_with_every_commands(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line is parsed by the named command's options alone (half the parser's
    cost): the same values, or the same refusal, as with the whole parser; its --help the same."""

    def parsed(parser: argparse.ArgumentParser) -> object:
        try:
            return vars(parser.parse_args(argv))
        except UsageError as exc:
            return str(exc)

    assert parsed(parser_for(argv)) == parsed(build_parser())
    helps = []
    for parser in (parser_for(argv), build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args([argv[0], "--help"])
        helps.append(capsys.readouterr().out)
    assert helps[0] == helps[1] and argv[0] in helps[0]


def test_the_whole_parser_answers_what_names_no_command() -> None:
    for argv in (["--version"], ["inspekt"], []):
        assert parser_for(argv).format_help() == build_parser().format_help()


def test_a_cluster_snapshot_read_as_one_host_is_refused_naming_its_nodes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    snapshot = str(Path(CT200).parent / "cluster-3")
    assert main(["plan", "--root", snapshot, "--lxc", "200"]) == 2
    err = capsys.readouterr().err
    assert f"{snapshot}: a cluster snapshot (nodes pve1, pve2, pve3): add --cluster" in err
    assert main(["plan", "--root", snapshot, "--cluster", "--lxc", "200"]) != 2


def test_a_report_of_a_cluster_snapshot_read_as_one_host_is_refused_before_writing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snapshot = str(Path(CT200).parent / "cluster-3")
    out = tmp_path / "report.html"
    assert main(["report", "--root", snapshot, "--lxc", "200", "-o", str(out)]) == 2
    assert "a cluster snapshot (nodes pve1, pve2, pve3)" in capsys.readouterr().err
    assert not out.exists()
