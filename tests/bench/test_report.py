"""report and compare on a run directory built from REAL measured cells (transformers serve)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.bench.compare import compare_runs
from gpudoctor.bench.loadgen import measure_cell
from gpudoctor.bench.report import DPI, FIGSIZE_IN, PLOT_FILES, write_report
from gpudoctor.bench.results_reader import ResultsError, load_results
from gpudoctor.bench.types import CellTarget, WorkloadSpec
from gpudoctor.commands.bench_report import compare, report
from tests.bench.llm_server import LlmServer

C0_BLUE = (0x1F, 0x77, 0xB4)  # matplotlib's first line colour: proves a data line was drawn


@pytest.fixture(scope="module")
def run_dir(llm_server: LlmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with two configs (the two APIs) x concurrency 1, 2 at TP1, plus TP2 failures."""
    out = tmp_path_factory.mktemp("run")
    target = CellTarget(llm_server.base_url, llm_server.model, str(llm_server.model_dir))
    lines = []
    for api in ("completions", "chat"):
        spec = WorkloadSpec(input_len=24, output_len=6, num_prompts=4, api=api,
                            ignore_eos=False, warmup=1)  # fmt: skip
        for c in (1, 2):
            cell = measure_cell(target, spec, c)
            lines.append({"key": f"{api}/tp1/c{c}", "config": api, "tp": 1, "concurrency": c,
                          "status": "ok", "measurement": cell})  # fmt: skip
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
    assert out.exit_code == 0 and "1.000" in out.output and "chat/tp2/c1" in out.output
    out = runner.invoke(compare, [str(run_dir), str(run_dir), "--json"])
    assert len(json.loads(out.output)["cells"]) == 4


def test_bad_results_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        load_results(tmp_path)
    (tmp_path / "results.jsonl").write_text('{"key": "a"}\n')
    with pytest.raises(ResultsError, match=r"results.jsonl:1: bad cell record"):
        load_results(tmp_path)
    out = CliRunner().invoke(report, [str(tmp_path)])
    assert out.exit_code == 1 and "bad cell record" in out.output


def test_later_line_for_a_key_wins(tmp_path: Path) -> None:
    row = {"key": "k", "config": "a", "tp": 1, "concurrency": 1, "status": "crashed",
           "measurement": None}  # fmt: skip
    rerun = {**row, "status": "ok", "measurement": {"metrics": {"output_throughput": 5.0}}}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(rerun) + "\n")
    (cell,) = load_results(tmp_path)
    assert cell.ok and cell.value("output_throughput") == 5.0


def test_torn_last_line_is_ignored_but_not_a_torn_middle(tmp_path: Path) -> None:
    row = {"key": "k", "config": "a", "tp": 1, "concurrency": 1, "status": "skipped",
           "measurement": None}  # fmt: skip
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + '\n{"key": "k2", "conf')
    assert [c.key for c in load_results(tmp_path)] == ["k"]
    (tmp_path / "results.jsonl").write_text('{"key": "k2", "conf\n' + json.dumps(row) + "\n")
    with pytest.raises(ResultsError, match=r"results.jsonl:1: not JSON"):
        load_results(tmp_path)
