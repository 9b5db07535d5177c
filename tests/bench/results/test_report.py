"""report and compare on a run directory built from REAL measured cells (transformers serve)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.bench.cell_spec import CellTarget, WorkloadSpec
from gpudoctor.bench.load.loadgen import measure_cell
from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results import noise
from gpudoctor.bench.results.compare import compare_runs
from gpudoctor.bench.results.metrics import compute_metrics
from gpudoctor.bench.results.reader import ResultsError, load_results, read_run
from gpudoctor.bench.results.report import DPI, FIGSIZE_IN, PLOT_FILES, write_report
from gpudoctor.commands.bench_report import compare, report
from tests.bench.llm_server import LlmServer

C0_BLUE = (0x1F, 0x77, 0xB4)  # matplotlib's first line colour: proves a data line was drawn


@pytest.fixture(scope="module")
def run_dir(llm_server: LlmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with two configs (the two APIs) x concurrency 1, 2 at TP1, plus TP2 failures."""
    out = tmp_path_factory.mktemp("run")
    lines = []
    for api in ("completions", "chat"):
        spec = WorkloadSpec(input_len=24, output_len=6, num_prompts=6, api=api,
                            ignore_eos=False, warmup=1)  # fmt: skip
        for c in (1, 2):
            raw = f"raw/{api}-tp1-c{c}.jsonl"
            target = CellTarget(llm_server.base_url, llm_server.model, str(llm_server.model_dir),
                                raw_path=out / raw)  # fmt: skip
            cell = measure_cell(target, spec, c)
            lines.append({"key": f"{api}/tp1/c{c}", "config": api, "tp": 1, "concurrency": c,
                          "status": "ok", "measurement": cell, "raw": raw})  # fmt: skip
    lines.append({"key": "chat/tp2/c1", "config": "chat", "tp": 2, "concurrency": 1,
                  "status": "crashed", "measurement": None})  # fmt: skip
    lines.append({"key": "chat/tp2/c2", "config": "chat", "tp": 2, "concurrency": 2,
                  "status": "skipped", "measurement": None})  # fmt: skip
    (out / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def test_report_writes_tables_and_plots(run_dir: Path, tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    files = write_report(run_dir, tmp_path)
    text = files.markdown.read_text()
    assert "## TP 1" in text and "## TP 2" in text
    assert "| config | c=1 | c=2 |" in text
    cells = {c.key: c for c in load_results(run_dir)}
    throughput = cells["chat/tp1/c2"].value("output_throughput")
    ttft50 = cells["chat/tp1/c2"].value("median_ttft_ms")
    assert "| chat | " in text and f"{throughput:.0f} · {ttft50:.0f}/" in text
    assert "| chat | crashed | skipped |" in text
    assert files.cells == 6
    for name in PLOT_FILES.values():
        path = tmp_path / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = mpimg.imread(path)
        assert image.shape[:2] == (FIGSIZE_IN[1] * DPI, FIGSIZE_IN[0] * DPI)
        rgb = (image[..., :3] * 255).round().astype(int)
        assert ((rgb == C0_BLUE).all(axis=-1)).sum() > 50, f"{name}: no data line drawn"
        assert f"]({name})" in text


def test_compare_run_with_itself_gives_ratios_of_one(run_dir: Path) -> None:
    result = compare_runs(run_dir, run_dir)
    assert len(result.cells) == 4 and not result.only_a and not result.only_b
    assert set(result.not_measured) == {"chat/tp2/c1", "chat/tp2/c2"}
    for cell in result.cells:
        measured = {k: v for k, v in cell.ratios.items() if v is not None}
        assert "output_throughput" in measured and "mean_tpot_ms" in measured
        assert all(v == 1.0 for v in measured.values())
        assert cell.ratios["accept_length"] is None  # no speculative decoding here


def test_compare_matches_cells_by_key(run_dir: Path, tmp_path: Path) -> None:
    rows = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    doubled = []
    for row in rows[1:]:  # B lacks the first cell and has an extra one
        if row["measurement"]:
            row["measurement"]["metrics"]["output_throughput"] *= 2
        doubled.append(row)
    doubled.append({**rows[0], "key": "new/tp1/c1"})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in doubled))
    result = compare_runs(run_dir, tmp_path)
    assert result.only_a == (rows[0]["key"],) and result.only_b == ("new/tp1/c1",)
    assert [c.ratios["output_throughput"] for c in result.cells] == pytest.approx([2.0] * 3)


def test_cli_report_and_compare(run_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(report, [str(run_dir), "--out", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["cells"] == 6 and (tmp_path / "report.md").is_file()
    out = runner.invoke(compare, [str(run_dir), str(run_dir)])
    assert out.exit_code == 0 and "chat/tp2/c1" in out.output
    cells = {c.key: c for c in load_results(run_dir)}
    tok_s = cells["chat/tp1/c2"].value("output_throughput")
    assert f"{tok_s:.1f} → {tok_s:.1f}  ×1.00 ≈" in out.output  # A, B, ratio, within noise
    assert "6/6" in out.output  # the requests behind each side
    out = runner.invoke(compare, [str(run_dir), str(run_dir), "--json"])
    assert len(json.loads(out.output)["cells"]) == 4


def test_missing_results_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        load_results(tmp_path)
    out = CliRunner().invoke(report, [str(tmp_path)])
    assert out.exit_code == 1 and "no such file" in out.output


def test_later_line_for_a_key_wins(tmp_path: Path) -> None:
    row = {"key": "k", "config": "a", "tp": 1, "concurrency": 1, "status": "crashed",
           "measurement": None}  # fmt: skip
    rerun = {**row, "status": "ok", "measurement": {"metrics": {"output_throughput": 5.0}}}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(rerun) + "\n")
    (cell,) = load_results(tmp_path)
    assert cell.ok and cell.value("output_throughput") == 5.0


def test_corrupt_middle_lines_are_skipped_and_reported_the_rest_kept(
    run_dir: Path, tmp_path: Path
) -> None:
    """Attack/fault: one corrupt line (a torn write, a disk error, an edit) in the middle of
    results.jsonl used to make report/compare refuse the whole run."""
    good = (run_dir / "results.jsonl").read_text().splitlines()
    damaged = [good[0], '{"key": "x", "conf', good[1], '{"key": "only-a-key"}', "[1, 2]",
               *good[2:], '{"key": "torn-at-the-e']  # fmt: skip
    (tmp_path / "results.jsonl").write_text("\n".join(damaged))
    run = read_run(tmp_path)
    assert [c.key for c in run.cells] == [json.loads(x)["key"] for x in good]
    assert [s.number for s in run.skipped] == [2, 4, 5]
    assert "skipped 3 corrupt line(s) (line 2: not JSON" in (run.warning() or "")
    out = CliRunner().invoke(report, [str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    assert "gpudoctor: warning:" in out.stderr and "skipped 3 corrupt line(s)" in out.stderr
    assert json.loads(out.stdout)["cells"] == 6
    text = (tmp_path / "report.md").read_text()
    assert "| chat | crashed | skipped |" in text and "**Warning:**" in text


def test_report_without_matplotlib_writes_markdown_and_says_how(
    run_dir: Path, tmp_path: Path
) -> None:
    """A user without the [plots] extra: matplotlib made unimportable in a real subprocess."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from gpudoctor.cli import run\n"
        f"sys.argv = ['gpudoctor', 'bench', 'report', {str(run_dir)!r}, '--out', {str(tmp_path)!r}]\n"
        "run()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "pip install 'gpudoctor[plots]'" in proc.stderr
    assert "and 0 plots" in proc.stdout
    text = (tmp_path / "report.md").read_text()
    assert "## TP 1" in text and "pip install 'gpudoctor[plots]'" in text
    assert not list(tmp_path.glob("*.png"))


def _raw_records(run_dir: Path, raw: str) -> list[RequestRecord]:
    return [
        RequestRecord.from_json(json.loads(x)) for x in (run_dir / raw).read_text().splitlines()
    ]


def test_bootstrap_statistics_of_the_full_sample_are_the_cell_metrics(run_dir: Path) -> None:
    row = json.loads((run_dir / "results.jsonl").read_text().splitlines()[1])
    records = _raw_records(run_dir, row["raw"])
    duration = row["measurement"]["duration_s"]
    sample = noise.sample_of(records, duration)
    assert sample is not None
    stats = noise.statistics(sample, range(sample.size))
    expected = compute_metrics(records, duration)
    for metric in noise.BOOTSTRAPPED:
        assert stats[metric] == pytest.approx(expected[metric], rel=1e-9), metric


@pytest.fixture(scope="module")
def steady_run(llm_server: LlmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of one cell: 16 requests one at a time (no queueing in the latencies)."""
    out = tmp_path_factory.mktemp("steady")
    spec = WorkloadSpec(input_len=24, output_len=8, num_prompts=16, ignore_eos=False, warmup=1)
    target = CellTarget(llm_server.base_url, llm_server.model, str(llm_server.model_dir),
                        raw_path=out / "raw/c1.jsonl")  # fmt: skip
    row = {"key": "steady/c1", "config": "steady", "tp": 1, "concurrency": 1, "status": "ok",
           "measurement": measure_cell(target, spec, 1), "raw": "raw/c1.jsonl"}  # fmt: skip
    (out / "results.jsonl").write_text(json.dumps(row) + "\n")
    return out


def test_compare_flags_noise_and_real_differences(steady_run: Path, tmp_path: Path) -> None:
    """B = A with every latency x10 (raw records and metrics): TPOT, E2E and throughput
    differ beyond the noise (x10: the 2-core CI box's own spread within a cell can pass
    3x); A against A is within it."""
    run_dir = steady_run
    (row,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    slow = [replace(r, ttft_s=r.ttft_s * 10, e2e_s=r.e2e_s * 10, wall_s=r.wall_s * 10,
                    chunk_times_s=tuple(t * 10 for t in r.chunk_times_s))
            for r in _raw_records(run_dir, row["raw"])]  # fmt: skip
    run_id = row["measurement"]["client"]["run_id"]
    (tmp_path / "raw").mkdir()
    (tmp_path / row["raw"]).write_text(
        "".join(json.dumps({"run_id": run_id, **r.to_json()}) + "\n" for r in slow)
    )
    row["measurement"]["duration_s"] *= 10
    row["measurement"]["metrics"] = compute_metrics(slow, row["measurement"]["duration_s"])
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    (same,) = compare_runs(run_dir, run_dir).cells
    assert all(same.within_noise[m] for m in noise.BOOTSTRAPPED)
    (cell,) = compare_runs(run_dir, tmp_path).cells
    for metric, expected in (("median_tpot_ms", 10.0), ("mean_e2e_ms", 10.0),
                             ("output_throughput", 0.1)):  # fmt: skip
        assert cell.ratios[metric] == pytest.approx(expected)
        low, high = cell.intervals[metric]
        assert low < high and not low <= 1.0 <= high, (metric, low, high)
        assert cell.within_noise[metric] is False
    assert cell.requests_a == cell.requests_b == 16
    assert cell.a["median_tpot_ms"] * 10 == pytest.approx(cell.b["median_tpot_ms"])
    out = CliRunner().invoke(compare, [str(run_dir), str(tmp_path)])
    assert out.exit_code == 0 and "16/16" in out.output
    assert "×0.10 " in out.output and "×0.10 ≈" not in out.output


def test_a_single_request_a_side_is_never_called_a_real_difference(steady_run: Path) -> None:
    """One request per cell (a c=1 cell of one wave, as on the H200): a bootstrap of one
    record resamples to itself, so its 'interval' is the ratio alone. Compare says it
    cannot tell ('?') instead of calling a one-sample difference real."""
    (row,) = [json.loads(x) for x in (steady_run / "results.jsonl").read_text().splitlines()]
    records = _raw_records(steady_run, row["raw"])
    run_id = row["measurement"]["client"]["run_id"]
    runs = []
    for name, scale in (("a", 1.0), ("b", 1.3)):
        one = replace(records[0], ttft_s=records[0].ttft_s * scale)
        run = steady_run.parent / f"one-{name}"
        (run / "raw").mkdir(parents=True)
        (run / row["raw"]).write_text(json.dumps({"run_id": run_id, **one.to_json()}) + "\n")
        measurement = {**row["measurement"], "metrics": compute_metrics([one], 1.0),
                       "completed": 1}  # fmt: skip
        (run / "results.jsonl").write_text(json.dumps({**row, "measurement": measurement}) + "\n")
        runs.append(run)
    (cell,) = compare_runs(*runs).cells
    assert cell.requests_a == cell.requests_b == 1
    assert cell.ratios["median_ttft_ms"] == pytest.approx(1.3)
    assert all(cell.within_noise[m] is None for m in noise.BOOTSTRAPPED)
    out = CliRunner().invoke(compare, [str(runs[0]), str(runs[1])])
    assert out.exit_code == 0 and "×1.30 ?" in out.output


def test_non_finite_numbers_and_wrong_types_are_refused_per_record(
    run_dir: Path, tmp_path: Path
) -> None:
    """Attack (issue 33.7): results lines another user or a broken writer left with
    ``"tp": 1e400`` (inf after parsing), a metric ``Infinity``, a metric of 1e300 and a
    search whose ``"met"`` is ``"x"`` killed ``bench report`` and ``compare`` ("a gpudoctor
    bug", no report). Each is skipped with the one-line warning; the report is written."""
    good = (run_dir / "results.jsonl").read_text().splitlines()
    first = json.loads(good[0])
    inf_metric = {**first, "key": "inf-metric"}
    inf_metric["measurement"] = {**first["measurement"],
                                 "metrics": {**first["measurement"]["metrics"], "output_throughput": 1e400}}  # fmt: skip
    huge = json.loads(json.dumps(inf_metric).replace("Infinity", "1e300"))
    huge["key"] = "huge-metric"
    search = {"key": "s", "record": "search", "config": "chat", "tp": 1, "status": "done",
              "search": {"over": "concurrency", "met": "x", "failed": None, "probes": []}}  # fmt: skip
    hostile = [
        good[0].replace('"tp": 1', '"tp": 1e400').replace(first["key"], "inf-tp"),
        json.dumps(inf_metric),  # json.dumps writes Infinity, as a careless writer would
        json.dumps(huge),
        json.dumps(search),
    ]
    assert "1e400" in hostile[0] and "Infinity" in hostile[1]
    (tmp_path / "results.jsonl").write_text("\n".join([*good, *hostile]) + "\n")
    run = read_run(tmp_path)
    assert [s.number for s in run.skipped] == [len(good) + i for i in range(1, 5)]
    assert {c.key for c in run.cells} == {json.loads(x)["key"] for x in good}
    out = CliRunner().invoke(report, [str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    warnings = [ln for ln in out.stderr.splitlines() if ln.startswith("gpudoctor: warning:")]
    assert len(warnings) == 1 and "skipped 4 corrupt line(s)" in warnings[0], out.stderr
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.html").is_file()
    other = tmp_path / "b"
    other.mkdir()
    (other / "results.jsonl").write_text((tmp_path / "results.jsonl").read_text())
    cmp = CliRunner().invoke(compare, [str(tmp_path), str(other)])
    assert cmp.exit_code == 0, cmp.output
