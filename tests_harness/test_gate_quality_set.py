"""The version-bump gate on an evaluation set in Seed-TTS-eval's layout (check quality-set), offline: the espeak-ng
set (harness.quality.espeak_set), generated in each version's environment by the espeak stand-in synthesizer and
judged item by item. Candidates are stand-in forks of the installed omnivoice that set `STANDIN_DAMAGE` (the damage
the stand-in applies in their environment; harness.quality.clone_run), gated against the installed release by
harness.audit.known_clone (the cases of `fastpath-suite audit known-answer --metric clone-set`): an identical one
passes, one with 10 dB noise is refused on MOS, one whose outputs swap two prompts' voices is refused on SIM alone,
and a German list that tiny.en cannot hear is not judged, then judged on SIM and MOS alone: its swap refused on SIM."""

from __future__ import annotations

import pytest

from harness.quality import espeak_set

# five venvs and the judges on 12 clips a side: beyond the default run's budget; .ci/run's controls stage

from harness.audit import known_clone
pytestmark = [pytest.mark.slow, pytest.mark.control]


@pytest.fixture(scope="module")
def espeak_folder(tmp_path_factory):
    return espeak_set.build(tmp_path_factory.mktemp("seedtts-espeak"))


@pytest.mark.parametrize("case", known_clone.CASES, ids=[c[0] for c in known_clone.CASES])
def test_the_gate_judges_a_clone_set_item_by_item(espeak_folder, prepare_here, tmp_path, case):
    row = known_clone.run_case(espeak_folder, case, tmp_path, log=lambda msg: None)
    assert row["meets"], row
    name, damage, lang, expected, judged_at_all, judged = case
    if not judged_at_all:  # a language the WER judge does not speak: not judged, never a pass
        assert row["summary"].startswith("not judged: the WER judge") and "cannot transcribe de" in row["summary"]
        return
    assert row["status"] == ("pass" if damage == "none" else "fail"), row
    names = {"wer": ["WER"], "sim": ["SIM"], "mos": ["MOS-OVRL", "MOS-P808"]}
    assert [m["metric"] for m in row["metrics"]] == [n for j in judged for n in names[j]]
    if damage != "none":
        assert all(m in row["summary"].split("not shown non-inferior on ")[-1] for m in known_clone.KNOWN[damage][0])
    written = sorted(p.name for p in (tmp_path / f"out-{damage}-{lang}" / "quality-set" / "candidate").glob("*.wav"))
    assert written == sorted(f"{line.split('|')[0]}.wav" for line in
                             (espeak_folder / lang / "meta.lst").read_text().splitlines())


def test_the_gate_over_two_workers_gives_the_serial_verdict(espeak_folder, prepare_here, tmp_path):
    """`--workers 2`: the set generated in each environment by two clone_run workers and judged by two workers
    (harness.quality.shards): the serial run's verdict, every metric's figures equal."""
    case = next(c for c in known_clone.CASES if c[1] == "swap" and c[2] == "en")
    serial = known_clone.run_case(espeak_folder, case, tmp_path / "serial", log=lambda msg: None)
    sharded = known_clone.run_case(espeak_folder, case, tmp_path / "sharded", log=lambda msg: None, workers=2)
    assert sharded["meets"] and sharded["status"] == serial["status"] == "fail", sharded
    assert sharded["metrics"] and sharded["metrics"] == serial["metrics"]
    out = tmp_path / "sharded" / "out-swap-en-2-workers"
    assert sorted(p.name for p in (out / "quality-set" / "judged").glob("judged-*.json")) == \
        ["judged-0-of-2.json", "judged-1-of-2.json"]
    assert sorted(p.name for p in out.glob("candidate-generate-*.log")) == \
        ["candidate-generate-0-of-2.log", "candidate-generate-1-of-2.log"]
