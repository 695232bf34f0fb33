"""``hwonnx explore``: the sweep's points and depths, the Pareto dominance and fronts on points
whose front is known, the recommendation rule, the outputs; a small sweep of the bundled CNN
on a local Dask cluster of two worker processes, with a point that does not fit on purpose,
``--resume``, a timed-out point, and the command line. Predict-only: no bitstream (minutes
to an hour per point) and no RTL simulation (a Verilator build per point)."""

import json
import shutil
import random
import re

import numpy as np
import pytest

from hwonnx.boards import estimate, get_board
from hwonnx.cli import main
from hwonnx.config import ArchConfig
from hwonnx.errors import UsageError
from hwonnx.examples import example_calibration, example_path
from hwonnx.explore import dominates, explore, front, parse_depths, parse_sizes
from hwonnx.explore.outputs import markdown, plot_png, summarize
from hwonnx.explore.pareto import MARGIN, SLACK, fronts, recommend
from hwonnx.boards.build import nextpnr_resources
from hwonnx.explore.point import run_task
from hwonnx.explore.progress import point_line


# The points of a sweep ----------------------------------------------------------------------

@pytest.mark.parametrize("text, sizes", [
    ("4..16", (4, 8, 16)), ("3..12", (4, 8)), ("4,8,12", (4, 8, 12)), ("12", (12,)),
    ("4..16,12", (4, 8, 12, 16)), ("8, 4, 8", (4, 8)), ("1..64", (1, 2, 4, 8, 16, 32, 64)),
])
def test_sizes(text, sizes):
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize("text, message", [
    ("x", "takes numbers and ranges"), ("4..", "takes numbers and ranges"),
    ("0", "from 1 to 64, not 0"), ("4..128", "from 1 to 64, not 128"),
    ("5..7", "holds no power of two"),
])
def test_bad_sizes(text, message):
    with pytest.raises(UsageError, match=message):
        parse_sizes(text)


def test_depths():
    assert parse_depths("auto") == parse_depths(None) == {}
    assert parse_depths("act=4096,wgt=2048,lut=2") == {"act_depth": 4096, "wgt_depth": 2048,
                                                       "lut_tables": 2}
    for bad in ("act", "act=x", "foo=1", "lut_tables=2"):
        with pytest.raises(UsageError, match="--depths takes 'auto'"):
            parse_depths(bad)


# Pareto dominance and fronts on points whose front is known --------------------------------

def test_dominates():
    assert dominates((1, 2), (1, 3))
    assert dominates((1, 2, 3, 4), (2, 3, 4, 5))
    assert not dominates((1, 2), (1, 2))             # equal: neither dominates
    assert not dominates((1, 3), (2, 2)) and not dominates((2, 2), (1, 3))   # a trade-off
    assert not dominates((2, 3), (1, 2))
    with pytest.raises(ValueError):
        dominates((1, 2), (1, 2, 3))


def test_front_with_ties_and_duplicates():
    points = [
        (1, 10),    # 0: front (fastest)
        (2, 5),     # 1: front
        (2, 5),     # 2: front, a duplicate of 1: equal points do not dominate each other
        (3, 5),     # 3: dominated by 1 (a tie in the resource, slower)
        (1, 10),    # 4: front, a duplicate of 0
        (4, 1),     # 5: front (smallest)
        (4, 2),     # 6: dominated by 5 (a tie in latency, larger)
        (1, 11),    # 7: dominated by 0
        (5, 5),     # 8: dominated by 1, 2, 3
    ]
    assert front(points) == [0, 1, 2, 4, 5]
    assert front([]) == []
    assert front([(7, 7)]) == [0]
    assert front([(3, 3)] * 3) == [0, 1, 2]


def test_front_in_four_objectives():
    points = [(10, 40, 32, 8600), (5, 112, 50, 13640), (6, 100, 79, 15560),
              (5, 112, 50, 13640), (5, 112, 49, 13640), (20, 40, 32, 8600)]
    # 4 dominates 1 and 3 (one block RAM fewer), 0 dominates 5; 2 is slower than 4 but has
    # fewer DSP blocks.
    assert front(points) == [0, 2, 4]


def _front_2d(points):
    """An independent 2-D front: sort by (x, y); a point is on it when its y is below every y
    of a point with a smaller x, or it repeats the last point kept."""
    kept, best, last = set(), float("inf"), None
    for index, (x, y) in sorted(enumerate(points), key=lambda item: (item[1], item[0])):
        if (x, y) == last or y < best:
            kept.add(index)
            last = (x, y)
        best = min(best, y)
    return sorted(kept)


def test_front_against_a_sorting_algorithm():
    rng = random.Random(7)
    for _ in range(300):
        points = [(rng.randint(0, 6), rng.randint(0, 6)) for _ in range(rng.randint(1, 12))]
        assert front(points) == _front_2d(points), points


def _record(array, latency_ms, dsp, bram, luts, status="ok"):
    rows, cols = map(int, array.split("x"))
    return {"key": f"{array}-key", "array": array, "rows": rows, "cols": cols,
            "status": status, "latency_s": latency_ms / 1e3,
            "throughput_per_s": 1e3 / latency_ms, "predicted_cycles": int(latency_ms * 25e3),
            "clock_mhz": 25.0, "resources": {"dsp": dsp, "bram": bram, "luts": luts},
            "reason": None if status == "ok" else "on purpose"}


DEVICE = {"dsp": 100, "bram": 100, "luts": 10_000}


def test_fronts_of_records():
    records = [_record("4x4", 4.0, 20, 10, 2000), _record("8x4", 2.0, 40, 30, 3000),
               _record("4x8", 2.5, 40, 20, 3000), _record("8x8", 1.0, 70, 30, 5000),
               _record("16x4", 2.0, 70, 10, 2000),
               _record("16x16", 0.1, 1, 1, 1, status="does-not-fit")]
    got = fronts(records)
    assert got["all"] == ["4x4-key", "8x4-key", "4x8-key", "8x8-key", "16x4-key"]
    assert got["dsp"] == ["4x4-key", "8x4-key", "8x8-key"]        # 4x8: 8x4's DSPs, slower
    assert got["bram"] == ["8x8-key", "16x4-key"]        # 16x4: 4x4's BRAM, faster
    assert got["luts"] == ["8x8-key", "16x4-key"]
    assert "16x16-key" not in sum(got.values(), [])              # only successful points


def test_recommendation_is_the_cheapest_point_near_the_fastest():
    records = [_record("4x4", 4.0, 20, 10, 2000),
               _record("8x8", 1.0, 70, 30, 5000),          # the fastest within the margin
               _record("8x16", 1.05, 50, 20, 4000),        # within 10% of it, and cheaper
               _record("16x16", 0.5, 95, 30, 5000)]        # fastest, beyond the 80% margin
    chosen, why = recommend(records, DEVICE)
    assert chosen["array"] == "8x16"
    assert "3 of 4 successful points leave 20% of every resource free" in why
    assert "5% slower than the fastest, 8x8 at 1 ms" in why
    assert chosen["key"] in fronts(records)["all"]
    # Beyond 10%, the fastest wins.
    records[2] = _record("8x16", 1.0 * (1 + SLACK) * 1.01, 50, 20, 4000)
    assert recommend(records, DEVICE)[0]["array"] == "8x8"


def test_recommendation_without_room_or_device():
    tight = [_record("8x8", 1.0, 90, 50, 5000), _record("4x8", 2.0, 85, 20, 9000)]
    assert all(r["resources"]["dsp"] > MARGIN * DEVICE["dsp"] for r in tight)
    chosen, why = recommend(tight, DEVICE)
    assert chosen["array"] == "8x8" and "No point leaves 20%" in why
    # The simulation target has no device: shares of the largest use; no margin.
    chosen, why = recommend([_record("16x16", 0.5, 300, 80, 30000),
                             _record("8x8", 0.52, 100, 50, 14000)], None)
    assert chosen["array"] == "8x8"
    assert "with 100 DSP blocks, 50 block RAMs, 14,000 LUTs. It is 4% slower" in why
    assert recommend([_record("8x8", 1, 1, 1, 1, status="failed")], DEVICE) == (
        None, "No point was built successfully, so there is nothing to recommend.")


def test_nextpnr_resources():
    ecp5 = {"MULT18X18D": {"used": 96, "total": 156}, "DP16KD": {"used": 94, "total": 208},
            "TRELLIS_COMB": {"used": 11560, "total": 83640}}
    assert nextpnr_resources("ecp5", ecp5) == {"dsp": 96, "bram": 94, "luts": 11560}
    gowin = {"MULT18X18": {"used": 3, "total": 10}, "MULT9X9": {"used": 2, "total": 20},
             "LUT4": {"used": 2396, "total": 8640}}
    assert nextpnr_resources("gowin", gowin) == {"dsp": 5, "luts": 2396}   # no BSRAM line


def test_outputs_of_hand_made_records():
    records = [_record("4x4", 4.0, 20, 10, 2000), _record("8x8", 1.0, 70, 30, 5000),
               {"key": "16x16-key", "array": "16x16", "rows": 16, "cols": 16,
                "status": "timeout", "reason": "stopped after 600 s (--timeout)"}]
    for r in records[:2]:
        r.update(fmax_mhz=40.0, resources_source={"dsp": "nextpnr", "bram": "nextpnr",
                                                  "luts": "nextpnr"})
    summary = summarize(records, board=get_board("ulx3s-85f"), model="m.onnx", calib=None,
                        rows=[4, 8, 16], cols=[4, 8, 16], depths={}, bitstream=True, sim=0)
    assert summary["counts"] == {"ok": 2, "does-not-fit": 0, "failed": 0, "timeout": 1}
    assert summary["resources_source"] == "nextpnr's place-and-route report"
    assert summary["latency_clock"].startswith("each point's Fmax")
    assert summary["recommendation"]["build_command"] == (
        "hwonnx build m.onnx --board ulx3s-85f --rows 8 --cols 8 --bitstream -o build-8x8/")
    text = markdown(summary)
    assert "| 16x16 | timed out | - | - | - | - | - | - |  |" in text
    assert "| 8x8 * | ok | 25,000 | 1 ms | 1,000 | 70 | 30 | 5,000 | all, DSP, BRAM, LUT |" \
        in text
    assert "- **16x16** (timed out): stopped after 600 s (--timeout)" in text
    _check_png(plot_png(summary))
    assert point_line(records[2], 3, 3) == "[3/3] 16x16: timed out: stopped after 600 s " \
                                           "(--timeout)"


def _check_png(data: bytes):
    """A PNG of a sensible size that is not blank."""
    import io

    from matplotlib.image import imread

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    pixels = imread(io.BytesIO(data))
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 900
    colours = np.unique(pixels.reshape(-1, pixels.shape[2]).round(2), axis=0)
    assert len(colours) > 50
    assert (pixels[..., :3] < 0.5).mean() > 0.005       # ink: axes, labels, points


# A sweep on a local Dask cluster ------------------------------------------------------------

BOARD = "ulx3s-85f"
# 16x32: its 32 requantizers (3 blocks each) and 16 element-wise lanes (2) leave 28 of the 156
# DSP blocks to its 512 products, the other 484 from logic: about 136,160 logic cells of the
# 83,640, does not fit. 4x32 fits with 76 of its 128 products from logic.
ROWS, COLS = (4, 16), (8, 32)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """digits_cnn on the ULX3S-85F, 4 points on a local cluster of two worker processes."""
    out = tmp_path_factory.mktemp("explore") / "sweep"
    started, finished = [], []
    summary = explore(example_path("digits_cnn"), BOARD, rows=ROWS, cols=COLS,
                      calib=example_calibration("digits_cnn"), out_dir=out, workers=2,
                      log=lambda message: None, on_start=started.append,
                      on_point=lambda record, done, total: finished.append((done, total)))
    return out, summary, started, finished


def test_sweep_records_every_point(sweep):
    out, summary, started, finished = sweep
    assert started == [4] and finished == [(1, 4), (2, 4), (3, 4), (4, 4)]
    stored = json.loads((out / "explore.json").read_text())
    assert stored == json.loads(json.dumps(summary))
    points = {r["array"]: r for r in stored["points"]}
    assert list(points) == ["4x8", "4x32", "16x8", "16x32"]
    assert {a: r["status"] for a, r in points.items()} == {
        "4x8": "ok", "4x32": "ok", "16x8": "ok", "16x32": "does-not-fit"}
    assert stored["counts"] == {"ok": 3, "does-not-fit": 1, "failed": 0, "timeout": 0}
    files = sorted(p.name for p in (out / "points").glob("*.json"))
    assert files == sorted(f"{r['key']}.json" for r in stored["points"])
    unfit = points["16x32"]
    # 512 PEs, 468 products beyond the DSP blocks (156 less 32 x 3 requantizer and 16
    # element-wise ones) at 74 cells each (hdl/dsp.logic_product: 37 CCU2C; 117,996 with the
    # partial products in LUT4s, 137 cells: 468 x 63 more)
    assert re.search(r"The 16x32 accelerator does not fit board 'ulx3s-85f': about 88512 "
                     r"logic cells but the device has 83640", unfit["reason"])
    assert unfit["estimate"]["dsp"] == 156 and unfit["predicted_cycles"] > 0
    board = get_board(BOARD)
    for r in (points[a] for a in ("4x8", "4x32", "16x8")):
        config = ArchConfig(**r["config"])
        assert (config.rows, config.cols) == (r["rows"], r["cols"])
        # resources: the fit check's estimate of the sized configuration; latency at 25 MHz
        usage = estimate(config, board)
        assert r["resources"] == {"dsp": usage.dsp, "bram": usage.bram_blocks,
                                  "luts": usage.luts}
        assert set(r["resources_source"].values()) == {"estimate"}
        assert r["latency_clock"] == "board clock" and r["fmax_mhz"] is None
        assert r["latency_s"] == pytest.approx(r["predicted_cycles"] / 25e6)
        assert r["throughput_per_s"] == pytest.approx(1 / r["latency_s"])
    assert "board clock, 25 MHz" in stored["latency_clock"]


def test_sweep_front_and_recommendation(sweep):
    out, summary, _, _ = sweep
    done = [r for r in summary["points"] if r["status"] == "ok"]
    vectors = {r["key"]: (r["latency_s"], *r["resources"].values()) for r in done}
    expected = [k for k, v in vectors.items()
                if not any(all(x <= y for x, y in zip(w, v)) and w != v
                           for w in vectors.values())]
    assert summary["pareto"]["all"] == expected
    for name in ("dsp", "bram", "luts"):
        pairs = {r["key"]: (r["latency_s"], r["resources"][name]) for r in done}
        assert summary["pareto"][name] == [
            k for k, v in pairs.items()
            if not any(dominates(w, v) for w in pairs.values())]
    chosen = summary["recommendation"]
    assert chosen["key"] in summary["pareto"]["all"]
    assert chosen["build_command"].startswith(
        f"hwonnx build {example_path('digits_cnn')} --board ulx3s-85f --rows ")
    text = (out / "explore.md").read_text()
    assert f"**{chosen['array']}**: " in text and "Rule: among the points that fit" in text
    for r in summary["points"]:
        assert f"| {r['array']}" in text
    _check_png((out / "explore.png").read_bytes())


def test_resume_skips_finished_points(sweep, tmp_path):
    out, summary, _, _ = sweep
    out = shutil.copytree(out, tmp_path / "copy")      # the other tests read the original
    folder = out / "points"
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    calls = []
    again = explore(example_path("digits_cnn"), BOARD, rows=ROWS, cols=COLS,
                    calib=example_calibration("digits_cnn"), out_dir=out, resume=True,
                    log=calls.append, on_start=calls.append,
                    on_point=lambda *args: calls.append(args))
    assert calls == ["Resuming: 4 of 4 point(s) finished before, 0 to run"]
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")} == before
    assert again["pareto"] == summary["pareto"]
    # A point that failed is run again; the finished ones are kept.
    record = next(r for r in summary["points"] if r["array"] == "4x8")
    path = folder / f"{record['key']}.json"
    path.write_text(json.dumps({**record, "status": "failed", "reason": "a worker died"}))
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    ran = []
    again = explore(example_path("digits_cnn"), BOARD, rows=ROWS, cols=COLS,
                    calib=example_calibration("digits_cnn"), out_dir=out, resume=True,
                    processes=False, log=lambda message: None,
                    on_point=lambda r, done, total: ran.append((r["array"], r["status"])))
    assert ran == [("4x8", "ok")]
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    assert [name for name in after if after[name] != before[name]] == [path.name]
    assert again["pareto"] == summary["pareto"]


def test_a_point_that_times_out(tmp_path):
    summary = explore(example_path("digits_mlp"), "sim", rows=(4,), cols=(4,),
                      calib=example_calibration("digits_mlp"), out_dir=tmp_path, timeout=0.2,
                      processes=False, log=lambda message: None)
    [record] = summary["points"]
    assert record["status"] == "timeout"
    assert record["reason"] == "stopped after 0.2 s (--timeout)"
    assert summary["recommendation"] is None
    assert "nothing to recommend" in (tmp_path / "explore.md").read_text()


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "0", "-5", "ten"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(tmp_path, capsys, value):
    """Regression: ``--timeout nan`` compared false with every limit, so no point ever timed
    out, and ``inf`` did the same; both ran the sweep."""
    with pytest.raises(SystemExit) as stop:
        main(["explore", "digits_mlp", "--board", "sim", f"--timeout={value}",
              "-o", str(tmp_path / "explore")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hwonnx explore: error: argument --timeout: expected a positive, finite number of "
        f"seconds, not '{value}'")
    assert not (tmp_path / "explore").exists()
    if value != "ten":                     # the library refuses the numbers too
        with pytest.raises(UsageError, match=r"^--timeout takes a positive number of "
                                             r"seconds, not (nan|inf|-inf|0|-5)$"):
            explore(example_path("digits_mlp"), "sim", rows=(4,), cols=(4,),
                    calib=example_calibration("digits_mlp"), out_dir=tmp_path / "explore",
                    timeout=float(value), processes=False, log=lambda message: None)


def test_a_point_that_fails_is_recorded_with_its_reason():
    """A point whose child process raises (here: the model is not ONNX) is ``failed``, with
    the error and the end of its log; the task itself does not raise."""
    payload = {"model": b"not an ONNX model", "calib": None, "inputs": None,
               "input_shapes": None}
    record = run_task({"board": "sim", "rows": 4, "cols": 4, "depths": {}, "bitstream": False,
                       "sim": 0}, "4x4-test", payload, 120)
    assert record["status"] == "failed", record
    assert record["reason"].startswith("ModelError: "), record["reason"]
    assert record["array"] == "4x4" and record["seconds"] < 120


def test_an_existing_cluster(tmp_path):
    """``scheduler``: the points go to a running cluster, which stays up afterwards."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster:
        summary = explore(example_path("digits_mlp"), "sim", rows=(4,), cols=(4, 8),
                          calib=example_calibration("digits_mlp"), out_dir=tmp_path,
                          scheduler=cluster.scheduler_address, log=lambda message: None)
        assert [r["status"] for r in summary["points"]] == ["ok", "ok"]
        with Client(cluster.scheduler_address) as client:
            assert len(client.scheduler_info()["workers"]) == 2


def test_refused_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="--bitstream needs a board"):
        explore(example_path("digits_mlp"), "sim", rows=(4,), cols=(4,), bitstream=True,
                calib=example_calibration("digits_mlp"), out_dir=tmp_path)
    with pytest.raises(UsageError, match="--sim 500 needs 500 samples, but the calibration "
                                         "data has 200"):
        explore(example_path("digits_mlp"), "sim", rows=(4,), cols=(4,), sim=500,
                calib=example_calibration("digits_mlp"), out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


# The command line -----------------------------------------------------------------------------

def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["explore", "digits_mlp", "--board", "sim", "--rows", "4", "--cols", "4..8",
                 "-o", str(out), "--workers", "2"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert lines[0] == ("Running 2 point(s) on a local Dask cluster of 2 processes (at most "
                        "600 s each) ...")
    assert [line[:6] for line in lines[1:]] == ["[1/2] ", "[2/2] "]     # in finishing order
    assert sorted(line[6:11] for line in lines[1:]) == ["4x4: ", "4x8: "]
    assert stdout.splitlines()[0].split() == ["array", "status", "predicted", "cycles",
                                              "latency", "inferences/s", "DSP", "block", "RAM",
                                              "LUTs", "Pareto", "front"]
    assert "Recommended: 4x" in stdout
    assert "Build it: hwonnx build digits_mlp --board sim --rows 4 --cols " in stdout
    for name in ("explore.json", "explore.md", "explore.png"):
        assert (out / name).is_file()
    assert len(list((out / "points").glob("*.json"))) == 2
    code = main(["explore", "digits_mlp", "--board", "sim", "--rows", "4", "--cols", "4..8",
                 "-o", str(out), "--resume"])
    stdout, stderr = capsys.readouterr()
    assert code == 0
    assert stderr == "Resuming: 2 of 2 point(s) finished before, 0 to run\n"


def test_cli_fails_when_no_point_succeeds(tmp_path, capsys):
    """A sweep with nothing to recommend exits with status 2 and says why, after writing its
    outputs (here: the only point times out)."""
    out = tmp_path / "none"
    code = main(["explore", "digits_mlp", "--board", "sim", "--rows", "4", "--cols", "4",
                 "--timeout", "0.2", "--workers", "1", "-o", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 2
    assert stderr.splitlines()[-1] == (f"hwonnx: error: No point of the sweep succeeded (1 "
                                       f"timed out); {out / 'explore.md'} gives each point's "
                                       f"reason")
    assert "nothing to recommend" in stdout and "Traceback" not in stderr
    assert "stopped after 0.2 s" in (out / "explore.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["missing.onnx"], r"Cannot read model 'missing\.onnx': No such file or directory"),
    (["digits_mlp", "--rows", "5..7"], r"--rows: the range '5\.\.7' holds no power of two"),
    (["digits_mlp", "--cols", "65"], r"--cols: an array side is from 1 to 64, not 65 .*"),
    (["digits_mlp", "--depths", "act"], r"--depths takes 'auto' or BUFFER=WORDS .*"),
    (["digits_mlp", "--workers", "0"], r"--workers takes a positive number, not 0"),
])
def test_cli_user_errors(tmp_path, capsys, argv, message):
    code = main(["explore", *argv, "--board", "sim", "-o", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert re.fullmatch(r"hwonnx: error: " + message + r"\n", err), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_long_reason_is_cut_in_the_progress_line():
    for status in ("does-not-fit", "failed", "timeout"):
        line = point_line({"array": "8x8", "status": status, "reason": "x" * 300}, 1, 2)
        assert line.startswith("[1/2] 8x8: ") and line.endswith("...") and len(line) < 240
