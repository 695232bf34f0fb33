"""A small reader of VCD files (IEEE 1364-2005, section 18) for the trace tests: the header's
variables and the value changes of the ones asked for. Written for these tests rather than
taken from pyvcd, whose reader refuses Verilator's ``$rootio`` scope."""

from dataclasses import dataclass, field

__all__ = ["Trace", "read_vcd"]


@dataclass
class Trace:
    timescale: str
    #: full name (scopes joined by ".", then the reference, e.g. "top.accel.cycles") ->
    #: (scope, reference, bit range as the header gives it: "[31:0]", "" for none)
    variables: "dict[str, tuple[str, str, str]]"
    #: full name -> [(time, value)], the value an int (None where any bit is x or z)
    changes: "dict[str, list[tuple[int, int | None]]]" = field(default_factory=dict)
    end: int = 0                    # the last timestamp

    def value_at(self, name: str, time: int) -> "int | None":
        """The value of ``name`` at ``time`` (after every change at ``time``)."""
        return self.sampled(name, [time])[0]

    def sampled(self, name: str, times: "list[int]") -> "list[int | None]":
        """The values of ``name`` at each of the ascending ``times``."""
        values, changes, at, value = [], self.changes[name], 0, None
        for time in times:
            while at < len(changes) and changes[at][0] <= time:
                value = changes[at][1]
                at += 1
            values.append(value)
        return values

    def rises(self, name: str) -> "list[int]":
        """The times at which 1-bit ``name`` goes from 0 to 1."""
        times, previous = [], None
        for at, value in self.changes[name]:
            if value == 1 and previous == 0:
                times.append(at)
            previous = value
        return times


def _number(text: str) -> "int | None":
    return None if any(c in text for c in "xXzZ") else int(text, 2)


def read_vcd(path, wanted=None) -> Trace:
    """Read the VCD file at ``path``: every variable's range and the value changes of the
    variables ``wanted`` (full names; None: every one)."""
    with open(path) as stream:
        words = iter(stream.read().split())
    scopes, variables, codes, timescale = [], {}, {}, ""
    for word in words:
        if word == "$scope":
            next(words)
            scopes.append(next(words))
        elif word == "$upscope":
            scopes.pop()
        elif word == "$timescale":
            timescale = " ".join(iter(words.__next__, "$end"))
        elif word == "$var":            # $var type width code reference [range] $end
            _, _, code, reference = (next(words) for _ in range(4))
            name = ".".join(scopes + [reference])
            variables[name] = (".".join(scopes), reference,
                               "".join(iter(words.__next__, "$end")))
            if wanted is None or name in wanted:
                codes.setdefault(code, []).append(name)
            continue
        elif word == "$enddefinitions":
            break
        if word in ("$scope", "$upscope"):
            for rest in words:
                if rest == "$end":
                    break
    trace = Trace(timescale, variables, {n: [] for names in codes.values() for n in names})
    time = 0
    for word in words:
        first = word[0]
        if first == "#":
            time = int(word[1:])
        elif first in "01xXzZ":
            value, code = _number(first), word[1:]
            for name in codes.get(code, ()):
                trace.changes[name].append((time, value))
        elif first in "bB":
            value, code = _number(word[1:]), next(words)
            for name in codes.get(code, ()):
                trace.changes[name].append((time, value))
        elif first in "rR":
            next(words)                 # real values: not read
    trace.end = time
    return trace
