"""Results as data for the quality verbs: `fastpath-suite audit simulate` and `fastpath-suite audit known-answer` write raw
figures, and their render_results turn those into the tables of docs/results.md (harness/run/results.py KINDS)."""

from __future__ import annotations

import json

import pytest

from harness.run import results
from harness.audit import known_answer
from harness.audit import simulate

SIMULATED = {"model": {"sentences": 10, "seeds": 2, "wer": 0.06, "concentration": 8.0, "words": [6, 21]},
             "margin_points": 1.0, "alpha": 0.025, "datasets": 5, "seed": 1,
             "rows": [{"case": "equivalent (every clip re-generated)", "true_delta_points": 0.0, "pass_rate": 0.8},
                      {"case": "worse, spread", "true_delta_points": 1.0, "pass_rate": 0.04}]}

KNOWN = {"margin_points": 4.0, "seeds": 3, "reps": 2, "sentences": 60, "seed": 0, "pool": 12,
         "judge": "whisper tiny.en ct2 sha256:abc", "espeak": "1.51",
         "rows": [{"case": "equivalent set (other seeds)", "want": "pass >= 80%", "repetitions": 2, "passed": 2,
                   "pass_rate": 1.0, "meets": True, "delta_points_mean": 0.25, "delta_points_sd": 0.5,
                   "upper_points_mean": 2.5, "verdicts": ["pass", "pass"]},
                  {"case": "worse by the margin, spread", "want": "pass <= 5%", "repetitions": 2, "passed": 1,
                   "pass_rate": 0.5, "meets": False, "delta_points_mean": 4.1, "delta_points_sd": 1.0,
                   "upper_points_mean": 6.0, "verdicts": ["pass", "fail"]}]}


def test_the_kinds_point_at_these_renderers():
    assert results.renderer("simulate") is simulate.render_results
    assert results.renderer("known-answer") is known_answer.render_results


def test_simulate_renders_one_row_per_case():
    text = simulate.render_results(SIMULATED)
    lines = text.splitlines()
    assert lines[0].startswith("10 sentences x 2 seeds a set, reference WER 6%") and "margin 1 WER points" in lines[0]
    assert "5 simulated data sets a row" in lines[0]
    assert lines[2:] == ["| case | true ΔWER (points) | gate passes |", "|---|---|---|",
                         "| equivalent (every clip re-generated) | +0.0 | 80.0% |",
                         "| worse, spread | +1.0 | 4.0% |"]


def test_known_answer_renders_one_row_per_case():
    text = known_answer.render_results(KNOWN)
    lines = text.splitlines()
    assert lines[0] == ("Margin 4 WER points; 60 sentences x 3 seeds a set; 2 repetitions a row. "
                        "Judge: whisper tiny.en ct2 sha256:abc; espeak-ng 1.51. Each pass rate with its 95% interval "
                        "(exact binomial, Clopper-Pearson); \"met\" compares the observed rate with the criterion.")
    # 2 of 2: the exact interval is (0.025 ** (1 / 2), 1) = 16% to 100%; 1 of 2: 1% to 99%
    assert lines[4] == ("| equivalent set (other seeds) | pass >= 80% | 2/2 (100%) | 16% to 100% | +0.25 (0.50) | "
                        "+2.50 | yes |")
    assert lines[5] == ("| worse by the margin, spread | pass <= 5% | 1/2 (50%) | 1% to 99% | +4.10 (1.00) | "
                        "+6.00 | NO |")


@pytest.mark.parametrize("passed, reps, low, high", [
    (0, 20, 0.0, 0.1684),  # none of 20 passing still allows a rate up to 17%: 1 - 0.025 ** (1 / 20)
    (20, 20, 0.8316, 1.0),
    (0, 3, 0.0, 0.7076),  # 1 - 0.025 ** (1 / 3)
    (1, 2, 0.0126, 0.9874),
])
def test_a_pass_rate_interval_is_the_exact_binomial_one(passed, reps, low, high):
    got = known_answer.rate_interval(passed, reps)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_simulate_writes_a_results_file_the_page_renders(tmp_path, capsys):
    out = tmp_path / "results"
    assert simulate.main(["--sentences", "8", "--seeds", "2", "--datasets", "3", "--results", str(out)]) == 0
    captured = capsys.readouterr()
    assert "| worse, spread | +1.0 |" in captured.out and "results file:" in captured.out
    assert "[simulate] rows 7/7" in captured.err  # progress, one line per row when stderr is not a terminal
    (path,) = (out / "simulate").glob("*.json")
    data = results.load(path)
    assert data["kind"] == "simulate" and json.loads(json.dumps(data["figures"])) == data["figures"]
    figures = data["figures"]
    assert figures["model"]["sentences"] == 8 and figures["datasets"] == 3 and len(figures["rows"]) == 7
    assert {"case", "true_delta_points", "pass_rate"} == set(figures["rows"][0])
    page = results.render(out)
    assert "## Quality gate: operating characteristics (simulation)" in page
    assert simulate.render_results(figures) in page


def test_simulate_quiet_prints_no_progress(capsys):
    assert simulate.main(["--sentences", "6", "--seeds", "2", "--datasets", "1", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_known_answer_shows_progress_per_chunk_of_clips(monkeypatch):
    """transcribe_all steps once per CHUNK clips (duplicates counted once), on the given Progress."""
    import io
    from types import SimpleNamespace

    from harness.run.progress import Progress

    done = []
    monkeypatch.setattr(known_answer, "_load", lambda name: None)
    monkeypatch.setattr(known_answer, "_transcribe", lambda specs: done.extend(specs) or [])
    specs = [(SimpleNamespace(id=f"s{i}"), 0, 0, known_answer.Damage()) for i in range(45)] * 2
    stream = io.StringIO()
    known_answer.transcribe_all(specs, None, workers=1, progress=Progress("known-answer", stream=stream))
    assert len(done) == 45
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[known-answer] render and transcribe: 3 steps"
    assert lines[-1].startswith("[known-answer] render and transcribe 3/3: 45/45 clips")



def fake_gating(monkeypatch):
    """run() without a judge: no clip rendered, each verdict keeps the candidate specs it was given."""
    from types import SimpleNamespace

    monkeypatch.setattr(known_answer, "transcribe_all", lambda *a, **k: None)
    monkeypatch.setattr(known_answer, "score", lambda judge, specs: specs)
    monkeypatch.setattr(known_answer, "gate", lambda ref, cand, **k: SimpleNamespace(
        passed=True, verdict="pass", delta_wer=0.0, upper=0.01, cand=[(s[0].id, s[1], s[3]) for s in cand]))


def test_known_answer_case_keys_name_every_case_once():
    keys = [c.key for c in known_answer.CASES]
    assert keys == ["equivalent", "spread-1x", "concentrated-1x", "spread-2x", "concentrated-2x", "cut"]


def test_some_cases_draw_what_they_draw_in_the_whole_table(monkeypatch):
    from types import SimpleNamespace

    fake_gating(monkeypatch)
    items = [SimpleNamespace(id=f"s{i}", text=" ".join(["word"] * (6 + i))) for i in range(10)]
    every = known_answer.run(None, None, reps=2, items=items, log=lambda line: None)
    some = known_answer.run(None, None, reps=2, items=items, log=lambda line: None,
                            cases=[c for c in known_answer.CASES if c.key in ("spread-2x", "cut")])
    assert [r.case.key for r in some] == ["spread-2x", "cut"]
    whole = {r.case.key: [v.cand for v in r.verdicts] for r in every}
    assert all([v.cand for v in r.verdicts] == whole[r.case.key] for r in some)


def test_known_answer_cases_option_runs_those_rows_and_says_so(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    import harness.quality.judge

    fake_gating(monkeypatch)
    monkeypatch.setattr(harness.quality.judge, "load_judge", lambda name: SimpleNamespace(identity="fake judge"))
    # the fake gate passes everything, so the cut row misses its criterion: exit 1, the file written all the same
    assert known_answer.main(["--reps", "1", "--cases", "equivalent", "cut", "--quiet", "--out",
                              str(tmp_path / "ka.json"), "--results", str(tmp_path / "results")]) == 1
    (path,) = (tmp_path / "results" / "known-answer").glob("*.json")
    figures = results.load(path)["figures"]
    assert [r["case"] for r in figures["rows"]] == [known_answer.CASES[0].name, known_answer.CASES[-1].name]
    text = known_answer.render_results(figures)
    assert "1 repetitions a row." in text and "2 of the 6 cases were run (--cases)" in text
    assert "2 of the 6" not in known_answer.render_results(dict(figures, rows=figures["rows"] * 3))


# --- SIM, MOS and the stream check ---------------------------------------------------------------------------

SCORES = {"metric": "sim", "margin": 0.02, "seeds": 3, "reps": 2, "sentences": 60, "pool": 8, "judge": "ge2e",
          "espeak": "1.51", "calibration": {"1.0": {"factor": 1.0328, "true_delta": -0.02, "se": 0.0009}},
          "rows": [{"case": "equivalent set (other seeds, same voices)", "want": "pass >= 80%", "repetitions": 2,
                    "passed": 2, "pass_rate": 1.0, "meets": True, "true_delta": None,
                    "metrics": {"SIM": {"passed": 2, "delta_mean": -0.0002, "delta_sd": 0.001, "lower_mean": -0.0019}},
                    "verdicts": [["pass"], ["pass"]]},
                   {"case": "voice shifted by the margin", "want": "pass <= 5%", "repetitions": 2, "passed": 1,
                    "pass_rate": 0.5, "meets": False, "true_delta": -0.02,
                    "metrics": {"SIM": {"passed": 1, "delta_mean": -0.021, "delta_sd": 0.0009, "lower_mean": -0.0242}},
                    "verdicts": [["pass"], ["fail"]]}]}
STREAMS = {"floor": 0.8, "chunks": 3, "streams": 2, "judge": "ge2e", "espeak": "1.51",
           "rows": [{"case": "one voice", "want": "refused <= 5%", "streams": 2, "refused": 0, "refused_rate": 0.0,
                     "meets": True, "lowest_seam": {"min": 0.84, "median": 0.88, "max": 0.93}},
                    {"case": "switch to another male speaker", "want": "none: reported", "streams": 2, "refused": 1,
                     "refused_rate": 0.5, "meets": None, "lowest_seam": {"min": 0.7, "median": 0.8, "max": 0.9}}]}


def test_the_score_kinds_point_at_their_renderers():
    from harness.audit import known_scores

    assert results.renderer("known-answer-sim") is known_scores.render_results
    assert results.renderer("known-answer-mos") is known_scores.render_results
    assert results.renderer("stream-voice") is known_scores.render_stream_results
    assert results.renderer("simulate-sim") is simulate.render_score_results
    assert results.renderer("simulate-mos") is simulate.render_score_results


def test_the_score_table_names_the_judge_the_calibration_and_each_row():
    from harness.audit import known_scores

    lines = known_scores.render_results(SCORES).splitlines()
    assert lines[0].startswith("SIM: GE2E cosine (resemblyzer), not the papers’ WavLM-ECAPA; margin 0.02;")
    assert "x1.0328, true ΔSIM -0.0200 (SE 0.0009" in lines[2]
    assert lines[-2] == ("| equivalent set (other seeds, same voices) | pass >= 80% | 2/2 (100%) | "
                         "2/2, -0.0002 (0.0010), -0.0019 | yes |")
    assert lines[-1].endswith("| 1/2 (50%) | 1/2, -0.0210 (0.0009), -0.0242 | NO |")


def test_the_stream_table_shows_a_row_without_a_criterion_as_such():
    from harness.audit import known_scores

    lines = known_scores.render_stream_results(STREAMS).splitlines()
    assert "below 0.8 at any seam" in lines[0]
    assert lines[-2] == "| one voice | refused <= 5% | 0/2 (0%) | 0.840 / 0.880 / 0.930 | yes |"
    assert lines[-1] == "| switch to another male speaker | none: reported | 1/2 (50%) | 0.700 / 0.800 / 0.900 | - |"


def test_simulate_of_a_score_gate_writes_its_own_results_file(tmp_path, capsys):
    out = tmp_path / "results"
    assert simulate.main(["--metric", "mos", "--sentences", "6", "--seeds", "2", "--datasets", "3", "--results",
                          str(out), "--quiet"]) == 0
    (path,) = (out / "simulate-mos").glob("*.json")
    figures = results.load(path)["figures"]
    assert figures["metric"] == "mos" and figures["margin"] == 0.1 and len(figures["rows"]) == 5
    assert figures["rows"][1]["case"] == "worse by 1x the margin, spread" and figures["rows"][1]["true_delta"] == -0.1
    page = results.render(out)
    assert "## Predicted-MOS gate: operating characteristics (simulation)" in page
    assert simulate.render_score_results(figures) in page
