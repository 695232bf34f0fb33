"""The sizing's repeated lowerings (hwonnx/compiler/replay.py, ``lower._lowered``): a sizing
lowers the model again for each depth it tries; a lowering emitted as one before takes its
outcome (``Lowerings``), and each is first tried dry, without its tiles
(``TileEmitter.dry``), failing as the lowering itself would. On the model of
tests/compiler/test_spilled_activations.py, whose lowerings fail for every reason the
external memory gives."""

import re

from hwonnx.api import build
from hwonnx.errors import ResourceError

from compiler_helpers import spilled_config, spilled_model, spilled_samples
from helpers import quiet


def test_sizing_replays_earlier_lowerings_to_the_same_program(monkeypatch):
    """The sizing lowers the model again for each depth it tries (the staging buffers grown,
    then the buffers sized); a lowering whose layers are emitted as in one that failed (the
    activation buffer full before the tensors moved out) fails again without emitting them,
    and one whose layers are emitted as in one that succeeded (the buffers sized: only depths
    read after the layers differ) takes its program (compiler.replay.Lowerings): fewer
    lowerings, the same program as without the replays."""
    import importlib

    from hwonnx.compiler.replay import Lowerings
    lowering = importlib.import_module("hwonnx.compiler.lower")
    emitted = []
    once = lowering._lower_once

    def counted(*args, **kwargs):
        if kwargs.get("dry"):           # each lowering is tried dry first (lower._lowered)
            emitted.append(args[4])     # the tensors outside
        return once(*args, **kwargs)

    def built():
        emitted.clear()
        result = build(spilled_model(), None, board="sim", ext_memory="ulx3s-sdram", act_depth=400,
                       calib=spilled_samples(8), log=quiet)
        return result.program, len(emitted)

    monkeypatch.setattr(lowering, "_lower_once", counted)
    replayed, lowerings = built()
    monkeypatch.setattr(Lowerings, "program", lambda self, *args: None)
    failures_only, failures_lowerings = built()
    monkeypatch.setattr(Lowerings, "replay", lambda self, *args: None)
    plain, plain_lowerings = built()
    assert lowerings < failures_lowerings < plain_lowerings
    for program in (replayed, failures_only):
        assert program.config == plain.config
        assert program.instructions == plain.instructions
        assert program.images == plain.images and program.words == plain.words
        assert program.layers == plain.layers and program.placements == plain.placements


def _outcome(graph, config, external, split, dry: bool):
    """What ``lower._lower_once`` gives: the error's type and text, or None (a dry lowering
    that reaches its instructions), or "program"; and what it gave ``Lowerings`` (the
    activation tables taken, the weight words it streams from)."""
    import importlib
    lowering = importlib.import_module("hwonnx.compiler.lower")
    emitted = {}
    try:
        result = lowering._lower_once(graph, config, True, {}, external, split, emitted,
                                      dry=dry)
        outcome = None if result is None else "program"
    except ResourceError as error:
        outcome = (type(error).__name__, str(error), getattr(error, "words", None))
    emitter = emitted.get("emitter")
    return outcome, emitter.table_count if emitter else None, emitted.get("streaming")


#: Architectures (of :func:`spilled_config`) on which the lowerings of :func:`spilled_model`
#: fail for each reason, or not.
DRY_CASES = (dict(act_depth=400), dict(act_depth=300, stage=64), dict(act_depth=200, stage=48),
             dict(act_depth=1200, wgt_depth=512), dict(act_depth=400, wgt_depth=256),
             dict(act_depth=300, wgt_depth=128, stage=96), dict(act_depth=400, wgt_depth=64))


def test_a_dry_lowering_fails_as_the_lowering_does():
    """With an external memory each lowering of a sizing is first tried without its tiles
    (lower._lowered, TileEmitter.dry): for every spill attempt, in parts or not, on
    architectures where the lowerings fail for every reason, the dry lowering raises the
    error the lowering raises (the activation buffer full, a staging buffer or two slots too
    small), with the same text and words, and gives Lowerings the same tables and streamed
    words; where it raises nothing, the lowering gets a program or fails only on the checks
    after the layers (the external memory's size, a buffer's words)."""
    from hwonnx.api import compile_model
    from hwonnx.compiler.spill import spill_attempts

    graph, _ = compile_model(spilled_model(), spilled_samples(4),
                             config=spilled_config(act_depth=4096), log=quiet)
    seen = set()
    for changes in DRY_CASES:
        config = spilled_config(**changes)
        for external in [frozenset()] + spill_attempts(graph, config):
            for split in (False, True):
                dry, tables, streaming = _outcome(graph, config, external, split, True)
                full, full_tables, full_streaming = _outcome(graph, config, external, split,
                                                             False)
                seen.add(dry if dry is None else dry[0])
                assert tables == full_tables and streaming == full_streaming
                if dry is not None:
                    assert dry == full
                else:
                    assert full == "program" or (full[0] == "ResourceError" and re.search(
                        r"external memory|words of the \w+ buffer", full[1])), full
    assert seen == {"ActivationBufferFull", "StageTooSmall", "SlotTooSmall", None}
