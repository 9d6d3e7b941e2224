"""Generates a report section by section, with progress and a durable pause between
sections (e.g. to stay under an upstream API's rate limit).

Input:  {"title": "Weekly report", "sections": ["sales", "support", "ops"], "pause": 2}
Output: {"title": ..., "sections": [{"name", "items", "total", "mean"}...], "grand_total"}

A pause longer than about a second suspends the run (status `sleeping`, worker freed) and
replays it when due: the sections already built come back from their stored steps.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import wasq

log = logging.getLogger("report")  # routed to the run's log by @wasq.task


def build_section(name: str) -> dict[str, Any]:
    # Stands in for slow work (queries, an API): randomness is fine inside a step, because
    # its result is stored and never recomputed. Seeded here only to make the demo stable.
    rng = random.Random(name)
    items = [rng.randint(10, 500) for _ in range(rng.randint(3, 8))]
    log.info("section %s: %d items", name, len(items))
    return {"name": name, "items": len(items), "total": sum(items),
            "mean": round(sum(items) / len(items), 1)}


@wasq.task
def main(input: dict) -> dict:
    input = input or {}
    names: list[str] = input.get("sections", ["sales", "support", "ops"])
    pause = float(input.get("pause", 2))
    if not names:
        raise wasq.Fatal("no sections to report on")
    sections = []
    for i, name in enumerate(names):
        wasq.progress(100 * i // len(names), f"section {name}")
        sections.append(wasq.step(f"section-{name}", build_section, name))
        if i < len(names) - 1:
            wasq.sleep(f"pause-after-{name}", pause)
    wasq.progress(100, "done")
    return {"title": input.get("title", "Report"), "sections": sections,
            "grand_total": sum(s["total"] for s in sections)}
