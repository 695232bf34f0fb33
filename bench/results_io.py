"""Writing a benchmark's measurements: ``<out>/<stem>.json`` and ``<out>/<stem>.md``."""

import json
import subprocess
from pathlib import Path

__all__ = ["RESULTS", "write_results"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(out: Path, stem: str, results: list, markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(f"Wrote {out / (stem + '.json')} and {out / (stem + '.md')}")


def measured_commit(excluded: str = "bench/results") -> str:
    """The commit a measurement runs at, ``+`` when the tree has changes outside ``excluded``
    (the results being written there, or the benchmark scripts too)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True,
                              text=True).stdout.strip()
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                  f":(top,exclude){excluded}")
    return git("rev-parse", "--short", "HEAD") + ("+" if changed else "")
