"""Fixtures every tier shares: the example hosts and a real OpenSSH server on loopback.

The tiers are folders; each runs everything the one before it does, and more:

* ``unit``: pure Python on in-memory models and texts, no command run (``pytest tests/unit``
  takes seconds);
* ``local``: runs commands on this machine (``sh``, the host scripts, stand-in tools on PATH)
  against copies of the example hosts in tmp directories, and the CLI in process;
* ``sshd``: a real OpenSSH server on 127.0.0.1 (marker ``sshd``);
* ``integration``: real ansible-playbook, a built and installed wheel, ``python -m proxgpu``;
* ``e2e``: a QEMU test host booting a real kernel (marker ``e2e``, minutes);
* ``device``: a real NVIDIA host, the machine itself (marker ``device``): run only with
  ``--device`` (``tests/device/run``), deselected otherwise, since CI has no GPU.

Their helpers live in ``tests/support``, shared with ``bench/``. Tests in every tier run
Proxmox VE's own code and test configs, from the sources ``tests/proxmox/sources.toml`` pins.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.phases import LEDGER, PHASES_KEY
from tests.proxmox.sources import SourcesUnavailableError, locate
from tests.support.sshd import SSHD, Sshd, running_sshd
from tests.support.tools import require_tool
from tests.support.trees import EXAMPLE_HOSTS, EXAMPLES, copy_example


@pytest.fixture(autouse=True, scope="session")
def _signing_key_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The signing key (``$XDG_CONFIG_HOME/proxgpu/key``) in a folder of the session's own, so
    that no test reads or writes the real one, and the OpenSSH transport's control folders
    (``$XDG_RUNTIME_DIR/proxgpu``) in a private one of the session's, short enough for a
    socket's path whatever a test makes of $HOME; subprocesses inherit both."""
    runtime = tempfile.mkdtemp(prefix="proxgpu-run-", dir="/tmp")  # mode 0700
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
        patch.setenv("XDG_RUNTIME_DIR", runtime)
        yield
    shutil.rmtree(runtime, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--device``: this machine is a real NVIDIA host; run the device tier on it."""
    parser.addoption(
        "--device",
        action="store_true",
        help="run the tests marked device (tests/device): this machine is a real NVIDIA host",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``--device``, the device tier is deselected, not skipped: a machine without a
    GPU (CI's) cannot run it, and a skip would read as a test that could not run."""
    if config.getoption("--device"):
        return
    kept = [item for item in items if "device" not in item.keywords]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if "device" in i.keywords])
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    """The whole suite (README's command) stops at once without Proxmox's sources, in one line
    saying how to get them, rather than failing each test that runs their code. A run of named
    files or tests still starts: those of them that need the sources fail with that line."""
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return
    try:
        locate()
    except SourcesUnavailableError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A private copy of the ct200 example host."""
    return copy_example(tmp_path, dest="host")


@pytest.fixture(params=EXAMPLE_HOSTS)
def example_host(request: pytest.FixtureRequest) -> Path:
    """Each example host tree in turn."""
    return EXAMPLES / str(request.param)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server on a free loopback port, with its own host and user keys."""
    require_tool(SSHD, "openssh-server")
    require_tool("ssh-keygen", "openssh-client")
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


# Each tier's first start and last stop (wall clock) as its tests' reports arrive: "e2e" for the
# tests marked so, "fast" for the rest. The tiers overlap where pytest -n runs them side by side.
_TIER_SPAN: dict[str, tuple[float, float]] = {}
# Each e2e test's (worker, seconds, phases line), from the report of its teardown
# (tests/e2e/conftest.py), in the order they ran. Kept here: pytest-xdist's controller loads this
# conftest, not the e2e folder's.
_E2E_PHASES: list[tuple[str, float, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Stretch the span of the report's tier to cover it, and keep an e2e test's phases."""
    tier = "e2e" if "e2e" in report.keywords else "fast"
    first, last = _TIER_SPAN.get(tier, (report.start, report.stop))
    _TIER_SPAN[tier] = (min(first, report.start), max(last, report.stop))
    for key, value in report.user_properties:
        if key == PHASES_KEY and isinstance(value, tuple):
            worker, seconds, line = value
            _E2E_PHASES.append((str(worker), float(seconds), str(line)))


def _e2e_seconds() -> float:
    """The e2e tier's time: its tests' seconds on the worker that spent the most (the test hosts
    run side by side, one a worker)."""
    spent: dict[str, float] = {}
    for worker, seconds, _ in _E2E_PHASES:
        spent[worker] = spent.get(worker, 0.0) + seconds
    return max(spent.values(), default=0.0)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each e2e test's phases, by worker, the e2e tier's time against its budget, and how long
    each tier took, wall clock, from its first test's start to its last one's end."""
    if _E2E_PHASES:
        title = f"e2e tier: {_e2e_seconds():.0f} s of its {LEDGER.budget:.0f} s budget"
        terminalreporter.section(title)
    for worker in sorted({worker for worker, _, _ in _E2E_PHASES}):
        # The tier's doctests take no time worth a line.
        lines = [line for w, seconds, line in _E2E_PHASES if w == worker and seconds >= 1]
        if worker and lines:
            terminalreporter.write_line(f"{worker}:")
        for line in lines:
            terminalreporter.write_line(line)
    spans = [f"{tier} {last - first:.0f} s" for tier, (first, last) in sorted(_TIER_SPAN.items())]
    if spans:
        terminalreporter.write_line(f"tiers, wall clock: {', '.join(spans)}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """An e2e tier that ran over its budget fails the run, even where every test passed."""
    spent = _e2e_seconds()
    if spent > LEDGER.budget and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nthe e2e tier took {spent:.0f} s, over its budget of {LEDGER.budget:.0f} s")
