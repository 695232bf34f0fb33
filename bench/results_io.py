"""Writing a benchmark's measurements: ``<out>/<stem>.json`` and ``<out>/<stem>.md``."""

import json
from pathlib import Path

__all__ = ["RESULTS", "write_results"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(out: Path, stem: str, results: list, markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(f"Wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
