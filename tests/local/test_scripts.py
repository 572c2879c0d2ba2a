"""Running a host script (proxgpu.host.scripts.run_script) on this machine, behind the prelude.

Every script in ``proxgpu/scripts`` is sent behind the shared ``prelude.sh``. Each test here sends
a small script of its own behind that same prelude (the ``scripts`` fixture), so what is tested
is what every script relies on: its arguments and stdin arriving intact, ``rec`` writing one
record whose fields come through unchanged, ``set -u``, and what run_script makes of the answer
and of a failure.
"""

from __future__ import annotations

import os
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from proxgpu.errors import CommandError, CommandTimeoutError, StepNotFinishedError
from proxgpu.host import scripts as host_scripts
from proxgpu.host.local import LocalHost
from proxgpu.host.scripts import ScriptOutput, ScriptRecord, run_script

PRELUDE = resources.files("proxgpu").joinpath("scripts/prelude.sh").read_text(encoding="utf-8")
BLOCKS = resources.files("proxgpu").joinpath("scripts/blocks.sh").read_text(encoding="utf-8")


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Script bodies by name; run_script sends each behind the real prelude, as its own."""
    bodies: dict[str, str] = {}
    monkeypatch.setattr(host_scripts, "script_text", lambda name: f"{PRELUDE}\n{bodies[name]}")
    return bodies


def said(answer: ScriptOutput, status: int = 0) -> list[ScriptRecord]:
    """The records a script wrote, once its last is the end record the prelude writes on exit
    (a token, and the exit status)."""
    *records, end = answer.records
    assert end.kind == "end" and len(end[0]) == 16 and end[1] == str(status), end
    return records


def test_a_script_answers_in_records_and_its_other_output_is_ignored(
    scripts: dict[str, str],
) -> None:
    scripts["probe"] = 'echo "starting up"\nrec uid "$(id -u)"\nrec args "$#" "$1"\n'
    host = LocalHost()
    answer = run_script(host, "probe", "first", "second")
    assert said(answer) == [
        ScriptRecord("uid", (str(os.getuid()),)),
        ScriptRecord("args", ("2", "first")),
    ]
    assert answer.returncode == 0 and answer.stderr == ""
    assert answer.stdout.startswith(b"starting up\n")
    assert host.commands_run == 1, "one script, one round trip"


def test_rec_writes_every_field_as_given(scripts: dict[str, str]) -> None:
    # rec escapes nothing: no backslash, percent sign, dash, glob or quote is interpreted.
    scripts["echo"] = 'rec fields "$@"\nrec none\n'
    fields = ["a b", "", "100%s %d", "back\\slash \\n \\t", "-n", "--", "$HOME", "'\"", "*", "ü"]
    answer = run_script(LocalHost(), "echo", *fields, "  ends with spaces  ")
    assert said(answer) == [
        ScriptRecord("fields", (*fields, "  ends with spaces  ")),
        ScriptRecord("none", ()),
    ]


def test_the_payload_reaches_the_script_on_stdin(scripts: dict[str, str]) -> None:
    scripts["read"] = 'rec size "$(wc -c)"\n'
    answer = run_script(LocalHost(), "read", payload=b"x" * 100_000)
    assert said(answer) == [ScriptRecord("size", ("100000",))]


def test_a_failing_script_names_its_step_when_checked(scripts: dict[str, str]) -> None:
    scripts["stage"] = 'rec started\necho "cannot stage: disk full" >&2\nexit 3\n'
    host = LocalHost()
    with pytest.raises(CommandError) as err:
        run_script(host, "stage")
    assert str(err.value) == f"{host.name}: the stage step exited with 3: cannot stage: disk full"
    assert (err.value.argv, err.value.returncode) == (["the stage step"], 3)
    answer = run_script(host, "stage", check=False)
    assert (answer.returncode, answer.stderr) == (3, "cannot stage: disk full\n")
    assert said(answer, status=3) == [ScriptRecord("started", ())]


def test_the_prelude_makes_an_unset_variable_an_error(scripts: dict[str, str]) -> None:
    scripts["typo"] = 'rec path "$undefined_name"\nrec unreached\n'
    answer = run_script(LocalHost(), "typo", check=False)
    assert answer.returncode != 0 and said(answer, status=answer.returncode) == []
    assert "undefined_name" in answer.stderr


def test_the_prelude_resolves_the_root_and_leaves_the_script_where_it_started(
    scripts: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root as the kernel names it (its links resolved) for every check of a path, found
    without moving the script: a post-action runs where the command was started."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    start = tmp_path / "start"
    start.mkdir()
    monkeypatch.chdir(start)
    scripts["where"] = 'rec at "$PWD" "$(pwd -P)" "$proxgpu_real"\n'
    answer = run_script(LocalHost(str(tmp_path / "link")), "where")
    assert said(answer) == [ScriptRecord("at", (str(start), str(start), str(real)))]
    answer = run_script(LocalHost(str(tmp_path / "gone")), "where")
    assert said(answer) == [ScriptRecord("at", (str(start), str(start), "//missing"))]


def test_a_script_that_runs_too_long_is_a_timeout(scripts: dict[str, str]) -> None:
    scripts["slow"] = "sleep 5\n"
    with pytest.raises(CommandTimeoutError):
        run_script(LocalHost(), "slow", timeout=0.3)


def test_a_bulk_script_keeps_its_answer_status_stderr_and_stdin(scripts: dict[str, str]) -> None:
    scripts["probe"] = 'cat; rec args "$#" "$2"; echo oops >&2; exit 5\n'
    answer = run_script(LocalHost(), "probe", "a", "b c", payload=b"in\n", check=False, bulk=True)
    assert answer.stdout.startswith(b"in\n#args\t2\tb c\n#end\t")
    assert said(answer, status=5) == [ScriptRecord("args", ("2", "b c"))]
    assert (answer.returncode, answer.stderr) == (5, "oops\n")
    with pytest.raises(CommandError, match="the probe step"):
        run_script(LocalHost(), "probe", "a", "b", bulk=True)


def test_a_bulk_answer_leaves_in_one_write_not_one_per_line() -> None:
    # Forty lines written apart: a reader gets each on its own, as an SSH server sends each
    # read as a packet of its own, unless blocks.sh gathers them.
    body = 'i=0; while [ $i -lt 40 ]; do echo "line $i"; sleep 0.01; i=$((i + 1)); done'

    def reads(argv: list[str]) -> tuple[int, bytes]:
        chunks = []
        with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            while chunk := os.read(proc.stdout.fileno(), 1 << 20):
                chunks.append(chunk)
        return len(chunks), b"".join(chunks)

    alone, text = reads(["sh", "-c", body])
    gathered, same = reads(["sh", "-c", BLOCKS, "blocks", body])
    assert alone > 10 and (gathered, same) == (1, text)
    assert text.splitlines()[-1] == b"line 39"


@pytest.mark.parametrize(
    "name", sorted(p.name[:-3] for p in resources.files("proxgpu").joinpath("scripts").iterdir())
)
def test_each_script_is_sent_without_its_comments_and_with_its_line_numbers(name: str) -> None:
    """What goes over the wire parses (``sh -n``), holds none of the file's comment lines and
    as many lines as the file, so that the shell's messages name the file's lines."""
    sent = host_scripts.script_text(name).split("\n", PRELUDE.count("\n") + 1)[-1]
    file = resources.files("proxgpu").joinpath(f"scripts/{name}.sh").read_text(encoding="utf-8")
    assert sent.count("\n") == file.count("\n")
    assert not [line for line in sent.splitlines() if line.lstrip().startswith("#")]
    assert len(sent) < len(file) * 0.8, "the comments are most of what is left out"
    parsed = subprocess.run(["sh", "-n", "-c", sent], capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, parsed.stderr


@pytest.mark.parametrize(
    ("body", "why"),
    [
        # A host (or a wrapper) that answers without running the script at all.
        ("trap - EXIT; exit 0", "it answered exit 0 with no output"),
        # The script's shell killed before its end: the answer stops short.
        ("rec done; kill -KILL $$", "its answer stopped before the step's end (exit -9)"),
        # An end record that is not this run's: replayed, or written by hand.
        (
            "rec end 0123456789abcdef 0; trap - EXIT",
            "its answer ended with another run's end record",
        ),
        # The script ended 0, but the transport reports another status.
        (
            'rec end "$proxgpu_token" 0; trap - EXIT; exit 3',
            "the step ended with status 0, but the host reported exit 3",
        ),
    ],
    ids=["no-output", "killed", "foreign-end", "other-status"],
)
def test_an_answer_without_its_runs_end_record_is_a_step_not_finished(
    scripts: dict[str, str], body: str, why: str
) -> None:
    scripts["commit"] = body + "\n"
    for check in (True, False):
        with pytest.raises(StepNotFinishedError) as err:
            run_script(LocalHost(), "commit", check=check)
        assert str(err.value) == f"localhost: the host did not finish the commit step ({why})"
        assert err.value.exit_code == 3
