"""The Pareto front of a sweep and the configuration ``hwonnx explore`` recommends.

Every objective is minimized: latency, and the DSP blocks, block RAMs and LUTs a point uses.
A point *dominates* another when it is no worse in every objective and better in one; the
front is the points no other point dominates. Equal points do not dominate each other, so
duplicates are on the front together or not at all."""

__all__ = ["RESOURCES", "RESOURCE_NAMES", "dominates", "front", "fronts", "recommend",
           "MARGIN", "SLACK", "RULE", "format_ms"]

#: The resources of a point (``record["resources"]``), in this order.
RESOURCES = ("dsp", "bram", "luts")
RESOURCE_NAMES = {"dsp": "DSP blocks", "bram": "block RAMs", "luts": "LUTs"}

#: The recommended point uses at most this share of each of the device's resources.
MARGIN = 0.8
#: ... and is the cheapest point at most this much slower than the fastest such point.
SLACK = 0.10

RULE = (f"among the points that fit and leave {1 - MARGIN:.0%} of every resource of the "
        f"device free (DSP blocks, block RAMs, LUTs: room for routing and for timing), take "
        f"those at most {SLACK:.0%} slower than the fastest of them, and of these the one "
        f"that uses the least of the device (the sum of its shares of the three resources), "
        f"then the fastest. Without a device (board 'sim'), the shares are of the largest "
        f"use among the points. If no point leaves the margin, the rule runs on every point "
        f"that fits. The chosen point is always on the Pareto front.")


def dominates(a, b) -> bool:
    """Whether objective vector ``a`` dominates ``b`` (every objective minimized): ``a`` is
    no worse than ``b`` in every objective and better in at least one."""
    if len(a) != len(b):
        raise ValueError(f"Objective vectors of different lengths: {a!r}, {b!r}")
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def front(vectors) -> "list[int]":
    """The indices (ascending) of the ``vectors`` that no other vector dominates."""
    vectors = [tuple(v) for v in vectors]
    return [i for i, v in enumerate(vectors)
            if not any(dominates(w, v) for j, w in enumerate(vectors) if j != i)]


def objectives(record: dict, resources=RESOURCES) -> tuple:
    return (record["latency_s"], *(record["resources"][name] for name in resources))


def fronts(records: "list[dict]") -> "dict[str, list[str]]":
    """The keys of the points on the front of latency against all three resources
    (``"all"``), and against each resource alone (``"dsp"``, ``"bram"``, ``"luts"``); only
    points with status ``ok`` take part."""
    done = [r for r in records if r["status"] == "ok"]
    result = {"all": [done[i]["key"] for i in front([objectives(r) for r in done])]}
    for name in RESOURCES:
        result[name] = [done[i]["key"] for i in front([objectives(r, (name,)) for r in done])]
    return result


def recommend(records: "list[dict]", device: "dict[str, int] | None",
              margin: float = MARGIN, slack: float = SLACK) -> "tuple[dict | None, str]":
    """The recommended point of ``records`` by :data:`RULE` and why, in sentences that follow
    its name ("8x8: 61.6 us per inference ..."); ``device``:
    the capacity of each resource (None for the simulation target). (None, why) when no point
    succeeded."""
    done = [r for r in records if r["status"] == "ok"]
    if not done:
        return None, "No point was built successfully, so there is nothing to recommend."
    if device:
        scale = {name: device[name] for name in RESOURCES}
    else:
        scale = {name: max(r["resources"][name] for r in done) for name in RESOURCES}
    scale = {name: value or 1 for name, value in scale.items()}

    def share(record, name):
        return record["resources"][name] / scale[name]

    roomy = [r for r in done if all(share(r, n) <= margin for n in RESOURCES)] if device \
        else done
    pool = roomy or done
    fastest = min(pool, key=lambda r: (r["latency_s"], sum(share(r, n) for n in RESOURCES)))
    near = [r for r in pool if r["latency_s"] <= fastest["latency_s"] * (1 + slack)]
    chosen = min(near, key=lambda r: (sum(share(r, n) for n in RESOURCES), r["latency_s"],
                                      r["rows"] * r["cols"], r["key"]))
    used = ", ".join(f"{chosen['resources'][n]:,} {RESOURCE_NAMES[n]}"
                     + (f" ({share(chosen, n):.0%})" if device else "") for n in RESOURCES)
    why = [f"{format_ms(chosen['latency_s'])} per inference "
           f"({chosen['throughput_per_s']:,.0f} inferences/s) with {used}."]
    if device and not roomy:
        why.append(f"No point leaves {1 - margin:.0%} of every resource free, so the rule "
                   f"ran on every point that fits; this one is tight and may not route or "
                   f"meet timing.")
    elif device:
        why.append(f"{len(roomy)} of {len(done)} successful points leave {1 - margin:.0%} "
                   f"of every resource free.")
    if chosen is fastest:
        why.append(("It is the fastest of them" if device else
                    "It is the fastest successful point") + (
            f", and the cheapest of the {len(near)} within {slack:.0%} of it."
            if len(near) > 1 else "."))
    else:
        cost = sum(share(fastest, n) for n in RESOURCES) / max(
            sum(share(chosen, n) for n in RESOURCES), 1e-12)
        slower = chosen["latency_s"] / fastest["latency_s"] - 1
        why.append(f"It is {slower:.0%} slower than the fastest, {fastest['array']} at "
                   f"{format_ms(fastest['latency_s'])}, which uses {cost:.1f}x as much "
                   + ("of the device." if device else "(in shares of the largest use of each "
                                                      "resource)."))
    return chosen, " ".join(why)


def format_ms(seconds: float) -> str:
    """A latency for people: ``0.123 ms``, ``45.6 us``, ``1.23 s``."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
