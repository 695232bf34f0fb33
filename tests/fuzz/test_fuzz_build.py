"""Structure-aware fuzzing of the loader and the build: Hypothesis draws lists of mutations
of the ONNX protobuf fields of small buildable seed models (dims of inputs, outputs,
value_info and initializers; attributes, their names, values and types; element types;
node inputs, outputs, op types, domains and order; initializer data and its storage fields;
opset and IR versions; graph inputs and outputs), and each mutated model goes through
``load_model``, the float evaluator and ``api.build(..., verilog=False)``.

Every outcome must be a clean hwonnx error (``HwonnxError``) or a correct result: a loaded
graph evaluates on a random input with the output shapes it declares, and a build is a
program that encodes and whose golden output on a random input is finite. Anything else is
a failure: another exception (a crash), a memory blow-up (a ``MemoryError`` under the cap:
the address space may grow by at most ``MEMORY_HEADROOM`` during the test; or a case that
raises the process's peak memory by more than 1 GiB), a case that runs longer than
``PER_CASE_SECONDS`` (a hang), a warning (an error in the test suite), or a wrong result.

A test runs its cases without stopping at the first failure: it counts every outcome,
groups failures by class (exception type and the hwonnx line that raised it, or the check
that failed), keeps the smallest example of each class, lets Hypothesis shrink it to the
fewest mutations that still fail the same way, and fails at the end listing every class
with its count, message and a reproducer (``KNOWN_FAILURES`` can mark classes as expected).

Tiers: ``test_fuzz_build_smoke`` (default, 300 cases, about 15 s) and ``test_fuzz_build``
(``-m slow``, 32 seed blocks of 2,000 cases, spread by pytest-xdist). Cases are seeded
(``hypothesis.seed`` per block, no example database), so every run draws the same ones. With
``HWONNX_RELIABILITY_LOG=<file>`` each test appends a JSON line of its counts."""

import contextlib
import faulthandler
import json
import os
import resource
import signal
import traceback
import warnings
import zlib
from collections import Counter
from pathlib import Path
from random import Random

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample, Unsatisfiable

from hwonnx.api import build, run_golden
from hwonnx.compiler.program import encode_program
from hwonnx.errors import HwonnxError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float

from fuzz_cases import CASES, SEEDS, mutated, random_feeds

PER_CASE_SECONDS = 10
MEMORY_HEADROOM = 4 << 30           # the address space may grow by this much during a test
SMOKE = (300, 1)                    # (cases per block, blocks)
SLOW = (2000, 32)
HWONNX = str(Path(__import__("hwonnx").__file__).resolve().parent)


# Running one case ------------------------------------------------------------------------

class WrongResult(Exception):
    """A model was read or built, but the result is not correct; ``kind`` names the check
    (and where the evaluator failed) for grouping."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _Alarm(BaseException):
    pass


def _quiet(message):
    pass


def run_case(data: bytes) -> str:
    """Load, evaluate and build one model; returns the outcome (``refused at load``,
    ``refused at build``, ``built``, ...). Raises WrongResult or whatever hwonnx raised
    other than a HwonnxError."""
    rng = np.random.default_rng(zlib.crc32(data))
    try:
        graph = load_model(data)
    except HwonnxError:
        return "refused at load"
    one = random_feeds(graph, rng)
    if one is not None:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")       # a float model may overflow: not a failure
            try:
                values = evaluate_float(graph, {k: v[0] for k, v in one.items()})
            except Exception as error:          # noqa: BLE001 - any failure is a wrong result
                raise WrongResult(f"the loaded graph does not evaluate ({type(error).__name__} "
                                  f"in {_where(error)})",
                                  f"{type(error).__name__}: {error}") from error
        for name in graph.outputs:
            got = np.shape(values.get(name))
            if got != tuple(graph.types[name].shape):
                raise WrongResult("an output's shape is not the declared one",
                                  f"output '{name}' has shape {got}, the graph declares "
                                  f"{graph.types[name].shape}")
    calib = random_feeds(graph, rng, 4)
    try:
        result = build(data, None, calib=calib, verilog=False, log=_quiet)
    except HwonnxError:
        return "refused at build" if calib is not None else "refused at build (no calib)"
    encode_program(result.program)
    if calib is None:
        return "built (input too large to run)"
    golden = run_golden(result, random_feeds(graph, rng, 2))
    for name, value in golden.outputs.items():
        if np.issubdtype(np.asarray(value).dtype, np.inexact) and not np.isfinite(value).all():
            raise WrongResult("the golden output is not finite",
                              f"golden output '{name}' is not finite")
    return "built"


def _where(error: BaseException) -> str:
    """The innermost hwonnx line of the traceback (else the innermost line)."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if f.filename.startswith(HWONNX)] or frames[-1:]
    if not ours:
        return "?"
    frame = ours[-1]
    return f"{os.path.relpath(frame.filename, os.path.dirname(HWONNX))}:{frame.lineno}"


def _attempt(data: bytes, warning_filter: str) -> "tuple[str, str | None, str]":
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(warning_filter)
            return run_case(data), None, ""
    except _Alarm as error:
        return "hang", f"hang in {_where(error)}", f"no result in {PER_CASE_SECONDS} s"
    except MemoryError as error:
        return "memory blow-up", f"MemoryError in {_where(error)}", str(error)
    except WrongResult as error:
        return "wrong result", f"wrong result: {error.kind}", str(error)
    except Warning as error:
        return "warning", f"{type(error).__name__} in {_where(error)}", str(error)
    except Exception as error:                  # noqa: BLE001 - the failures we look for
        return "crash", f"{type(error).__name__} in {_where(error)}", str(error)


def classify(data: bytes) -> "tuple[str, str | None, str]":
    """``(outcome, failure class or None, message)`` of one case, within the time limit.
    Warnings are errors, as in the test suite; after one the case runs again with warnings
    ignored, and the message says how that ends. A case that grows the peak memory of the
    process by more than a GiB is a blow-up even if it ends well."""
    def expire(signum, frame):
        raise _Alarm()

    previous = signal.signal(signal.SIGALRM, expire)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    signal.setitimer(signal.ITIMER_REAL, PER_CASE_SECONDS)
    try:
        outcome, failure, message = _attempt(data, "error")
        if outcome == "warning":
            signal.setitimer(signal.ITIMER_REAL, PER_CASE_SECONDS)
            then, other, more = _attempt(data, "ignore")
            message += f" (with warnings ignored: {then}{': ' + other if other else ''})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / (1 << 20)  # GiB
    if grown > 1 and failure is None:
        return "memory blow-up", "memory blow-up: peak memory grew by more than 1 GiB", \
            f"peak memory grew by {grown:.1f} GiB ({outcome})"
    return outcome, failure, message


# The tests -------------------------------------------------------------------------------

@contextlib.contextmanager
def memory_cap():
    """Cap the address space at its current size plus MEMORY_HEADROOM."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as stream:
        in_use = int(stream.read().split()[0]) * resource.getpagesize()
    cap = in_use + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _reproducer(seed_name: str, mutations) -> str:
    return (f"# in the repository's root, with PYTHONPATH=tests:\n"
            f"from tests.fuzz.test_fuzz_build import mutated, run_case\n"
            f"run_case(mutated({seed_name!r}, {mutations!r}))")


def fuzz(block_seed: int, examples: int) -> dict:
    """Run ``examples`` Hypothesis cases; count outcomes and group failures by class."""
    outcomes, failures = Counter(), {}

    @seed(block_seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=CASES)
    def generate(case):
        # a watchdog for a hang the alarm cannot interrupt (in C code): stacks, then exit
        faulthandler.dump_traceback_later(6 * PER_CASE_SECONDS, exit=True)
        outcome, failure, message = classify(mutated(*case))
        faulthandler.cancel_dump_traceback_later()
        outcomes[outcome] += 1
        if failure:
            entry = failures.setdefault(failure, {"count": 0, "outcome": outcome,
                                                  "message": message, "case": case})
            entry["count"] += 1
            if _size(case) < _size(entry["case"]):
                entry["case"], entry["message"] = case, message

    with memory_cap():
        generate()
        for failure, entry in failures.items():
            entry["case"] = _shrink(failure, entry["case"])
    return {"outcomes": outcomes, "failures": failures}


def _size(case) -> "tuple[int, int]":
    return len(case[1]), len(repr(case))


def _shrink(failure: str, case):
    """A minimal case of ``failure``: the smallest sub-list of the case's mutations that
    still fails the same way (Hypothesis's shrinker over those sub-lists)."""
    seed_name, mutations = case
    if len(mutations) == 1:
        return case

    def same(candidate):
        return classify(mutated(*candidate))[1] == failure

    try:
        return find(st.tuples(st.just(seed_name), st.lists(st.sampled_from(mutations),
                                                           min_size=1,
                                                           max_size=len(mutations))),
                    same, settings=settings(max_examples=100, database=None, deadline=None,
                                            suppress_health_check=list(HealthCheck)),
                    random=Random(0))
    except (NoSuchExample, Unsatisfiable):
        return case


def _report(result: dict) -> str:
    lines = []
    for failure, entry in sorted(result["failures"].items(), key=lambda i: -i[1]["count"]):
        seed_name, mutations = entry["case"]
        message = classify(mutated(seed_name, mutations))[2] or entry["message"]
        lines.append(f"{failure} ({entry['outcome']}, {entry['count']} case(s)): "
                     f"{message[:300]}\n{_reproducer(seed_name, mutations)}")
    return "\n\n".join(lines)


#: Failure classes (prefixes of ``classify``'s class names) to report as expected failures,
#: with the reason: the test then xfails when every failure it finds is one of them, and
#: fails on any other. Empty: every failure fails the test.
KNOWN_FAILURES: "dict[str, str]" = {}


def _check(name: str, block: int, examples: int) -> None:
    block_seed = zlib.crc32(f"fuzz-build/{name}/{block}".encode())
    result = fuzz(block_seed, examples)
    outcomes, failures = result["outcomes"], result["failures"]
    log = os.environ.get("HWONNX_RELIABILITY_LOG")
    if log:
        with open(log, "a") as stream:
            stream.write(json.dumps({"kind": "fuzz-build", "tier": name, "block": block,
                                     "seed": block_seed, "cases": sum(outcomes.values()),
                                     "outcomes": outcomes,
                                     "failures": {k: {"count": v["count"],
                                                      "outcome": v["outcome"],
                                                      "message": v["message"][:300],
                                                      "case": repr(v["case"])}
                                                  for k, v in failures.items()}}) + "\n")
    print(f"\n{sum(outcomes.values())} cases: {dict(outcomes)}")
    assert sum(outcomes.values()) >= examples
    assert outcomes["built"] > 0 and outcomes["refused at load"] > 0, outcomes
    if not failures:
        return
    report = (f"{len(failures)} failure class(es) in {sum(outcomes.values())} cases "
              f"(seed {block_seed}):\n\n{_report(result)}")
    known = {k: reason for k, reason in KNOWN_FAILURES.items()
             if any(failure.startswith(k) for failure in failures)}
    if all(any(failure.startswith(k) for k in known) for failure in failures):
        pytest.xfail("known failures: " + "; ".join(known.values()) + "\n\n" + report)
    pytest.fail(report, pytrace=False)


def test_seed_models_build():
    """Every seed is valid and builds to a program with a finite golden output."""
    for name in SEEDS:
        assert classify(SEEDS[name]().SerializeToString()) == ("built", None, ""), name


@pytest.mark.parametrize("block", range(SMOKE[1]))
def test_fuzz_build_smoke(block):
    _check("smoke", block, SMOKE[0])


@pytest.mark.slow
@pytest.mark.parametrize("block", range(SLOW[1]))
def test_fuzz_build(block):
    _check("slow", block, SLOW[0])


@pytest.mark.parametrize("seed_name, mutations", [
    ("qdq", [("op_type", 8, "Mul")]),              # a Mul with one input
    ("mlp", [("op_type", 32, "TopK")]),            # a TopK without K
    ("cnn", [("init_dims", 34, [0], True)]),       # a Pad whose constant value is empty
], ids=["one-input-Mul", "TopK-without-K", "empty-Pad-value"])
def test_found_by_the_slow_tier(seed_name, mutations):
    """Classes the slow tier found (IndexError in the support check and the Pad converter),
    shrunk: each is now refused at load with an hwonnx error."""
    assert run_case(mutated(seed_name, mutations)) == "refused at load"
