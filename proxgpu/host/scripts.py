"""Run proxgpu's shell scripts (``proxgpu/scripts/NAME.sh``) on a host, one round trip each.

Every script is sent as ``sh -c SCRIPT sh ARG...`` with the shared ``prelude.sh`` in front of it
(and, before that, the host's root, which the prelude's ``enter`` confines every path to),
so it runs unchanged on a Proxmox VE host over SSH, on this machine and against a directory tree.
Data goes in as arguments and, for file contents, as base64 lines on stdin. A script answers in
one record format: a line ``#KIND`` followed by tab-separated fields (the prelude's ``rec``
function writes them); other lines are ignored. However a script's shell exits by itself, the
prelude's EXIT trap answers last ``#end TOKEN STATUS``, with the run's random token and the
shell's exit status: :func:`run_script` believes an answer only with that record, and only where
the status is the one the transport reported. A cut-short answer, a killed script, or a host
(or a wrapper on it, an ``authorized_keys`` ``command=``) that answers "exit 0" without running
the script is then :class:`~proxgpu.errors.StepNotFinishedError`, never a step done.

>>> [(r.kind, r.fields) for r in parse_records("#done\\t0\\nnoise\\n#api\\t1\\tab12\\n#end\\n")]
[('done', ('0',)), ('api', ('1', 'ab12')), ('end', ())]
"""

from __future__ import annotations

import base64
import logging
import secrets
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources

from proxgpu.errors import CommandError, StepNotFinishedError
from proxgpu.host.base import Host

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScriptRecord:
    """One ``#KIND<TAB>FIELD...`` line of a script's answer."""

    kind: str
    fields: tuple[str, ...]

    def __getitem__(self, index: int) -> str:
        return self.fields[index]


@dataclass(frozen=True)
class ScriptOutput:
    """A script's records, exit status and stderr (a non-zero exit is data here)."""

    records: list[ScriptRecord]
    returncode: int
    stdout: bytes
    stderr: str

    def of(self, kind: str) -> list[ScriptRecord]:
        """Every record of ``kind``, in order."""
        return [r for r in self.records if r.kind == kind]

    def first(self, kind: str) -> ScriptRecord | None:
        """The first record of ``kind``, if any."""
        return next((r for r in self.records if r.kind == kind), None)

    def has(self, kind: str) -> bool:
        """Whether any record is of ``kind``."""
        return self.first(kind) is not None


class ScriptArgs:
    """Base of the typed argument groups a script takes per item (a file, a function).

    A subclass is a frozen dataclass; :meth:`argv` gives its fields in order, as the script's
    ``shift N`` loop reads them, with ``None`` spelled ``-``.
    """

    def argv(self) -> list[str]:
        """The fields as script arguments."""
        values = (getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
        return ["-" if v is None else str(v) for v in values]


def parse_records(text: str) -> list[ScriptRecord]:
    """The records in a script's output (see the module docstring)."""
    records = []
    for line in text.splitlines():
        if line.startswith("#"):
            kind, *rest = line[1:].split("\t")
            records.append(ScriptRecord(kind, tuple(rest)))
    return records


@cache
def script_text(name: str) -> str:
    """The prelude and ``scripts/NAME.sh``, as sent to the host."""
    return _script_file("prelude") + "\n" + _script_file(name)


@cache
def _script_file(name: str) -> str:
    text = resources.files("proxgpu").joinpath("scripts", f"{name}.sh").read_text(encoding="utf-8")
    # Comment lines go as empty lines: nearly half of every command's bytes, sent, encrypted and
    # parsed for nothing, while the shell's own messages still name the file's line numbers.
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.split("\n"))


def script_argv(root: str, name: str, *args: str, token: str = "", bulk: bool = False) -> list[str]:
    """The command that runs ``scripts/NAME.sh`` with ``args`` on a host whose root is ``root``,
    its end record carrying ``token`` (see :func:`run_script`).

    The first line names the step (``proxgpu_step=NAME``), for whoever reads the host's
    process list or its audit log.

    >>> argv = script_argv("/srv/tree", "gather", "/srv/tree", "check", token="5eed", bulk=True)
    >>> argv[:2], argv[3], argv[4].splitlines()[0], argv[5:]
    (['sh', '-c'], 'blocks', 'proxgpu_step=gather proxgpu_prefix=/srv/tree proxgpu_token=5eed', \
['/srv/tree', 'check'])
    """
    # The prelude's `enter` keeps every path inside this root (see prelude.sh).
    settings = {"step": name, "prefix": root.rstrip("/"), "token": token}
    first = " ".join(f"proxgpu_{key}={shlex.quote(value)}" for key, value in settings.items())
    text = f"{first}\n{script_text(name)}"
    if bulk:
        return ["sh", "-c", _script_file("blocks"), "blocks", text, *args]
    return ["sh", "-c", text, "sh", *args]


def run_script(
    host: Host,
    name: str,
    *args: str,
    payload: bytes = b"",
    timeout: float | None = None,
    check: bool = True,
    bulk: bool = False,
) -> ScriptOutput:
    """Run ``scripts/NAME.sh`` on ``host`` with ``args`` (and ``payload`` on stdin).

    ``bulk`` is for a script whose answer is only read once it has ended (nothing streams):
    its stdout then leaves the host in blocks of up to 1 MiB (``scripts/blocks.sh``), a handful
    of SSH packets instead of one per write (the gather makes hundreds).

    :raises CommandError: when ``check`` and the script exits non-zero, naming the step.
    :raises StepNotFinishedError: when the answer lacks this run's end record, or its status is
        not the one the transport reported (see the module's text).
    :raises HostUnreachableError: when the transport fails.
    """
    start = time.monotonic()
    token = secrets.token_hex(8)
    argv = script_argv(host.root, name, *args, token=token, bulk=bulk)
    result = host.run(argv, stdin=payload, timeout=timeout)
    log.info(
        "%s: %s.sh (%d args, %d bytes in, %d out) exited %d in %.2f s",
        host.name,
        name,
        len(args),
        len(payload),
        len(result.stdout),
        result.returncode,
        time.monotonic() - start,
    )
    output = ScriptOutput(
        records=parse_records(result.stdout.decode("utf-8", "replace")),
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr_text,
    )
    unfinished = _unfinished(output, token)
    if unfinished is not None:
        raise StepNotFinishedError(host.name, name, unfinished)
    if check and not result.ok:
        raise CommandError(host.name, [f"the {name} step"], result.returncode, output.stderr)
    return output


def _unfinished(output: ScriptOutput, token: str) -> str | None:
    """Why ``output`` is no proof that its script ran to its end (None: it is).

    >>> records = [ScriptRecord("done", ("0",)), ScriptRecord("end", ("5eed", "0"))]
    >>> ended = ScriptOutput(records, 0, b"", "")
    >>> _unfinished(ended, "5eed") is None
    True
    >>> _unfinished(ScriptOutput([], 0, b"", ""), "5eed")
    'it answered exit 0 with no output'
    >>> _unfinished(ended, "f00d")
    "its answer ended with another run's end record"
    """
    status = output.returncode
    if not output.records and not output.stdout.strip():
        return f"it answered exit {status} with no output"
    last = output.records[-1] if output.records else None
    if last is None or last.kind != "end" or len(last.fields) != 2:
        return f"its answer stopped before the step's end (exit {status})"
    if last[0] != token:
        return "its answer ended with another run's end record"
    if last[1] != str(status):
        return f"the step ended with status {last[1]}, but the host reported exit {status}"
    return None


def read_files(host: Host, paths: Sequence[str]) -> list[bytes | None]:
    """The bytes of each of ``paths`` (as the host's own system names them: under ``host``'s
    root, a directory tree's or an image's, on its side), ``None`` where one is absent or not a
    regular file; all in one command, bounded as every command is (none for no paths).

    >>> from proxgpu.host import DirectoryHost
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> [len(data or b"") > 0 for data in read_files(tree, ["/etc/pve/lxc/200.conf", "/nope"])]
    [True, False]
    """
    if not paths:
        return []
    prefix = host.root.rstrip("/")
    found: list[bytes | None] = [None] * len(paths)
    for record in run_script(host, "read", *(prefix + path for path in paths)).of("text"):
        if record[1] != "-":
            found[int(record[0])] = base64.b64decode(record[1])
    return found


def as_text(data: bytes | None) -> str | None:
    """A file's bytes as :func:`read_files` gave them, as text (bytes that are not UTF-8
    replaced, as a plan shows them); ``None`` for an absent file.

    >>> as_text(b"ok \\xff"), as_text(None)
    ('ok \\ufffd', None)
    """
    return None if data is None else data.decode("utf-8", "replace")
