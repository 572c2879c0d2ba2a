"""Start-up cost of the ``proxgpu`` command, against a bare interpreter started in the same run,
in an install like a user's (:mod:`bench.plain`: a fresh environment with ``pip install .``).

Each measurement is a fresh process, as a user's command is, with that environment's
interpreter:

* floor: ``python -c pass``, what starting Python costs at all;
* ``proxgpu --help``: the parser alone (what lazy imports can bring close to the floor);
* ``proxgpu inspect --root examples/hosts/ct200 --json``: a whole offline command.

Both are the installed ``proxgpu`` command, run outside the checkout (so that the installed
copy, not the checkout, is imported); the ratios to the floor are what to compare between runs
and machines.

Run: python bench/bench_startup.py [RUNS]
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.plain import plain_install  # noqa: E402
from bench.timing import sample  # noqa: E402

RUNS = 21
COMMANDS = {
    "proxgpu --help": ["--help"],
    "proxgpu inspect --root examples/hosts/ct200 --json": [
        "inspect",
        "--root",
        str(REPO / "examples" / "hosts" / "ct200"),
        "--json",
    ],
}


def run(argv: list[str]) -> None:
    """One run of ``argv`` in a fresh process, outside the checkout; it must succeed.

    No timeout: with one, Python polls for the child's exit with sleeps of up to 50 ms, which
    would round every time here up to the next poll.
    """
    subprocess.run(argv, check=True, cwd="/", stdout=subprocess.DEVNULL)


def measure(bin_dir: Path, runs: int = RUNS) -> dict[str, tuple[float, float, float]]:
    """Median seconds, ratio to the ``python -c pass`` floor and mean CPU seconds per run (the
    child's, and the gather script's it ran) for each command of the environment ``bin_dir``.

    >>> measure(Path(sys.executable).parent, 1)["floor: python -c pass"][1]
    1.0
    """
    floor = sample(partial(run, [str(bin_dir / "python"), "-c", "pass"]), runs, warmups=1)
    results = {"floor: python -c pass": (floor.wall, 1.0, floor.client_cpu)}
    for name, args in COMMANDS.items():
        taken = sample(partial(run, [str(bin_dir / "proxgpu"), *args]), runs, warmups=1)
        results[name] = (taken.wall, taken.wall / floor.wall, taken.client_cpu)
    return results


def main() -> None:
    """Print each command's median wall time, its ratio to the floor and its CPU."""
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    with plain_install() as bin_dir:
        print(f"median of {runs} runs, a plain install in {bin_dir.parent}")
        for name, (seconds, ratio, cpu) in measure(bin_dir, runs).items():
            print(
                f"{name:55} {seconds * 1000:8.1f} ms  {ratio:5.1f}x floor  CPU {cpu * 1000:6.1f} ms"
            )


if __name__ == "__main__":
    main()
