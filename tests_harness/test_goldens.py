"""Stock OmniVoice on the tiny checkpoint against the goldens of the known omnivoice versions (fixtures/goldens/).

The goldens say what stock computes at each parity point, 8 steps, seed 0: portable parts compared on every
machine (scoring calls, final tokens and waveform lengths exactly; per-step logits moments and waveform block RMS
within a tolerance measured across instruction sets) and, per machine (numerics key), exact sha256 of the logits
and waveform bytes. A failure means stock behaviour on the installed omnivoice is none of the known ones: the
message says what was compared and lists, per known version and point, which parts differ. Record the installed
version's goldens with `fastpath-suite maintain goldens --record` once the change is understood.
"""

from __future__ import annotations

import copy
import re

import pytest

from fastpath import fingerprints
from harness.gate import goldens
from harness.run import strict
from harness.run.machine import numerics_key


@pytest.fixture(scope="module")
def observed(model, checkpoint):
    if checkpoint.kind != "tiny":
        pytest.skip(f"goldens are recorded on the tiny test checkpoint; this run uses the {checkpoint.kind} one")
    return goldens.record_goldens(model)


@pytest.fixture(scope="module")
def known():
    found = goldens.load_goldens()
    assert found, f"no goldens in {goldens.GOLDENS_DIR}: run `fastpath-suite maintain goldens --record`"
    return found


@pytest.mark.slow  # beyond the default run's budget: .ci/run's controls stage runs it on every change
@pytest.mark.control
@pytest.mark.cpu
def test_stock_matches_the_goldens_of_a_known_version(observed, known, checkpoint):
    """Portable parts everywhere, plus the exact hashes where this machine's are recorded (the report says which)."""
    differences = goldens.match_versions(observed, known)
    same = goldens.matching(differences)
    report = goldens.describe(differences, known, goldens.environment(), goldens.checkpoint_digests(checkpoint.path),
                              key=numerics_key())
    print(report)
    assert same, report


@pytest.mark.cpu
def test_stock_bits_match_the_goldens_recorded_for_this_machine(observed, known, request):
    """The exact logits and waveform hashes of the installed version, on a machine whose numerics key has them
    (per machine: another machine's are not judged here; the portable parts are, by the test above)."""
    version, key = fingerprints.omnivoice_version(), numerics_key()
    if version not in known:
        strict.missing(request.config, f"no goldens for the installed omnivoice {version}",
                       "record them with `fastpath-suite maintain goldens --record`")
    recorded = goldens.exact_keys(known[version])
    if key not in recorded:
        strict.not_judged(f"no exact hashes recorded for this machine ({key}; recorded: {', '.join(recorded)}): bits "
                          f"of CPU fp32 logits differ between processors and instruction sets",
                          "record this machine's with `fastpath-suite maintain goldens --record`")
    moved = {p: [d for d in goldens.compare_point(observed[p], known[version]["points"][p], key) if "sha256" in d]
             for p in observed}
    assert not any(moved.values()), {p: d for p, d in moved.items() if d}


def test_goldens_of_every_version_were_made_with_the_same_weights(known, checkpoint):
    """The tiny checkpoint's cache key includes the omnivoice version, but its weights must not depend on it."""
    digests = {version: goldens.weight_digests(data) for version, data in known.items()}
    assert len({tuple(sorted(d.items())) for d in digests.values()}) == 1, digests
    if checkpoint.kind == "tiny":
        here = goldens.checkpoint_digests(checkpoint.path)
        assert here == next(iter(digests.values())), f"this tiny checkpoint {here} vs the goldens' {digests}"


def test_goldens_cover_every_parity_point(known):
    from harness.parity.parity import POINTS

    for version, data in known.items():
        assert set(data["points"]) == set(POINTS), f"{version}: {sorted(set(POINTS) ^ set(data['points']))}"
        assert data["settings"]["num_step"] == goldens.NUM_STEP and data["settings"]["seed"] == goldens.SEED


def test_comparison_names_each_part_that_moved(known):
    version, data = sorted(known.items())[-1]
    key = goldens.exact_keys(data)[0]
    other = copy.deepcopy(data["points"])
    point = sorted(other)[0]
    other[point]["tokens"][0][0][0] += 1
    other[point]["exact"][key]["logits"] = "0" * 64
    mean, std = other[point]["logits_moments"][3]
    other[point]["logits_moments"][3][0] = mean + 2 * goldens.TOLERANCES["logits_moments"] * std
    differences = goldens.match_versions(other, {version: data})
    assert goldens.matching(differences) == []
    parts = goldens.compare_point(other[point], data["points"][point], key)
    assert any(p.startswith("tokens: 1/") for p in parts), parts
    assert any(p.startswith("logits_moments: moved") and "tensor 3, mean" in p for p in parts), parts
    assert "logits: sha256 differs (exact, recorded for this machine)" in parts, parts
    assert not goldens.compare_point(other[point], data["points"][point], "a machine with nothing recorded")[2:], \
        "hashes of another machine must not be compared"
    assert not any(differences[version][p] for p in other if p != point)
    assert f"{point}: tokens: 1/" in goldens.describe(differences, {version: data}, data["environment"])


def test_portable_summaries_ignore_noise_under_their_tolerance(known):
    """Moves the size measured between instruction sets (1.6e-8 of a std) pass; 10x the tolerance fails."""
    golden = next(iter(known.values()))["points"]["auto_voice"]
    for scale, moved in ((1.6e-8, False), (10 * goldens.TOLERANCES["logits_moments"], True)):
        other = copy.deepcopy(golden)
        other["logits_moments"] = [[m + scale * s, s * (1 + scale)] for m, s in golden["logits_moments"]]
        other["waveform_rms"] = [[r + scale for r in w] for w in golden["waveform_rms"]]
        parts = goldens.compare_point(other, golden, "none")
        assert bool(parts) == moved and (not moved or len(parts) == 2), (scale, parts)


def test_every_goldens_file_has_the_portable_parts_and_hashes_for_both_instruction_sets(known):
    """Recorded on one machine at AVX-512 and at AVX2 (emulated: docs/machines.md)."""
    for version, data in known.items():
        for name, point in data["points"].items():
            assert all(part in point for part in goldens.TOLERANCES), (version, name)
        caps = {key.split("__")[1].split("+")[0] for key in goldens.exact_keys(data)}
        assert {"avx512", "avx2"} <= caps, (version, goldens.exact_keys(data))


# torch's CPU capabilities (torch.backends.cpu.get_cpu_capability(), lower case) and what isa_tag appends
NUMERICS_KEY = re.compile(r"^[a-z0-9.-]+__(default|avx2|avx512|sve\d*|vsx|zvector)(\+[a-z0-9]+)*(~[a-z0-9-]+)*"
                          r"__\d+t__torch-[a-z0-9.-]+$")


def test_every_recorded_numerics_key_is_one_the_key_function_can_produce(known):
    """A key numerics_key() can no longer produce (e.g. recorded before the instruction set entered it) never
    matches again: its exact hashes are dead weight and the machines they came from skip the exact comparison."""
    assert NUMERICS_KEY.match(numerics_key()), numerics_key()
    stale = {version: [k for k in goldens.exact_keys(data) if not NUMERICS_KEY.match(k)]
             for version, data in known.items()}
    stale = {v: keys for v, keys in stale.items() if keys}
    assert not stale, f"goldens hold exact hashes under keys no machine produces now: {stale}; migrate or remove them"


def test_a_summary_that_became_nan_moved_and_one_that_stayed_nan_did_not():
    """|x - y| with a NaN is NaN, and NaN > worst is False: a NaN on one side alone read as within tolerance."""
    nan = float("nan")
    for part in goldens.TOLERANCES:
        assert goldens._summary_difference(part, [[0.5, nan]], [[0.5, nan]]) is None
        for observed, golden in (([[0.5, nan]], [[0.5, 1.0]]), ([[0.5, 1.0]], [[0.5, nan]])):
            moved = goldens._summary_difference(part, observed, golden)
            assert moved and moved.startswith(f"{part}: moved nan at"), moved


# Rule tests on small hand-made points: each field a comparison reads, and each message a maintainer acts on.
RECORD = "(record them: fastpath-suite maintain goldens --record)"


def hashes(tag: str) -> dict:
    return {part: f"{tag}-{part}" for part in goldens.HASHED_PARTS}


def made_point(**changes) -> dict:
    point = {"scoring_calls": 32, "tokens": [[[1, 2, 3], [4, 5, 6]]], "waveform_samples": [100],
             "logits_moments": [[0.0, 4.0], [1.0, 2.0]], "waveform_rms": [[0.5, 0.25]],
             "exact": {"machine-a": hashes("a")}}
    point.update(changes)
    return point


@pytest.mark.parametrize("part, observed, golden, expected", [
    # logits moments move relative to the golden tensor's std: 8e-6 on a std of 4 is 2e-6
    ("logits_moments", [[8e-6, 4.0]], [[0.0, 4.0]], "logits_moments: moved 2e-06 at tensor 0, mean (tolerance 1e-06)"),
    ("logits_moments", [[0.0, 4.0], [1.0, 0.5 + 1e-6]], [[0.0, 4.0], [1.0, 0.5]],
     "logits_moments: moved 2e-06 at tensor 1, std (tolerance 1e-06)"),
    ("logits_moments", [[0.0, 4.0], [3e-6, 4.0]], [[0.0, 4.0], [0.0, 4.0]], None),  # 7.5e-7 of a std of 4
    # a std of 0 cannot scale: the change is absolute
    ("logits_moments", [[1.0 + 4e-6, 0.0]], [[1.0, 0.0]],
     "logits_moments: moved 4e-06 at tensor 0, mean (tolerance 1e-06)"),
    ("logits_moments", [[0.0, 4.0], [8e-6, 4.0]], [[0.0, 4.0], [0.0, 4.0]],
     "logits_moments: moved 2e-06 at tensor 1, mean (tolerance 1e-06)"),
    # waveform RMS moves absolutely, whatever the block's own value
    ("waveform_rms", [[0.5, 2.0], [0.5, 2.0 + 3e-6]], [[0.5, 2.0], [0.5, 2.0]],
     "waveform_rms: moved 3e-06 at waveform 1, block 1 (tolerance 1e-06)"),
    ("waveform_rms", [[0.5, 2.0], [2.0 + 3e-6, 0.5]], [[0.5, 2.0], [2.0, 0.5]],
     "waveform_rms: moved 3e-06 at waveform 1, block 0 (tolerance 1e-06)"),
    # two blocks that moved as far: the first is named
    ("waveform_rms", [[0.5 + 2e-6, 0.5 + 2e-6]], [[0.5, 0.5]], "waveform_rms: moved 2e-06 at waveform 0, block 0 "
                                                               "(tolerance 1e-06)"),
    # exactly the tolerance is within it; identical summaries are
    ("waveform_rms", [[1e-6, 0.5]], [[0.0, 0.5]], None),
    ("waveform_rms", [[0.5, 0.25]], [[0.5, 0.25]], None),
    ("logits_moments", [[3.0, 0.5]], [[3.0, 0.5]], None),
    # a NaN on both sides is no move, and the blocks after it are still compared
    ("waveform_rms", [[float("nan"), 1.0 + 5e-6]], [[float("nan"), 1.0]],
     "waveform_rms: moved 5e-06 at waveform 0, block 1 (tolerance 1e-06)"),
    # another number of entries, or of values in one entry, is reported as such
    ("waveform_rms", [[0.5, 0.25]], [[0.5, 0.25], [0.5, 0.25]], "waveform_rms: 1 vs 2 entries"),
    ("logits_moments", [[0.0, 4.0, 1.0]], [[0.0, 4.0]], "logits_moments: entry 0 has 3 vs 2 values"),
    ("waveform_rms", [[0.5, 0.25], [0.5]], [[0.5, 0.25], [0.5, 0.25]], "waveform_rms: entry 1 has 1 vs 2 values"),
])
def test_a_portable_summary_names_how_far_and_where_it_moved_beyond_its_tolerance(part, observed, golden, expected):
    assert goldens._summary_difference(part, observed, golden) == expected


@pytest.mark.parametrize("observed, expected", [
    (made_point(), []),
    (made_point(scoring_calls=33), ["scoring_calls: 33 vs 32"]),
    (made_point(tokens=[[[1, 2, 3], [4, 5, 7]]]), ["tokens: 1/6 differ"]),
    (made_point(waveform_samples=[120]), ["waveform_samples: [120] vs [100]"]),
    (made_point(logits_moments=[[8e-6, 4.0], [1.0, 2.0]]),
     ["logits_moments: moved 2e-06 at tensor 0, mean (tolerance 1e-06)"]),
    (made_point(waveform_rms=[[0.5, 0.25 + 3e-6]]),
     ["waveform_rms: moved 3e-06 at waveform 0, block 1 (tolerance 1e-06)"]),
    (made_point(exact={"machine-a": {**hashes("a"), "logits": "other"}}),
     ["logits: sha256 differs (exact, recorded for this machine)"]),
    (made_point(scoring_calls=33, waveform_samples=[120], exact={"machine-a": {**hashes("a"), "waveform": "other"}}),
     ["scoring_calls: 33 vs 32", "waveform_samples: [120] vs [100]",
      "waveform: sha256 differs (exact, recorded for this machine)"]),
])
def test_compare_point_lists_each_part_that_differs_in_order_and_nothing_else(observed, expected):
    """Without a key, the hashes are compared under the observed point's own numerics key."""
    assert goldens.compare_point(observed, made_point()) == expected


def test_without_a_key_the_hashes_compared_are_those_of_the_observed_points_own_key():
    # the golden lists another machine's hashes first: they are not this point's
    golden = made_point(exact={"machine-z": hashes("z"), "machine-a": hashes("a")})
    assert goldens.compare_point(made_point(), golden) == []
    moved = made_point(exact={"machine-a": {**hashes("a"), "decoded": "other"}})
    assert goldens.compare_point(moved, golden) == ["decoded: sha256 differs (exact, recorded for this machine)"]


def test_compare_point_compares_the_hashes_of_the_key_it_is_given_and_says_which_are_not_recorded():
    golden = made_point(exact={"machine-a": hashes("a"), "machine-b": {"logits": "b-logits"}})
    observed = made_point(exact={"machine-a": {**hashes("a"), "decoded": "moved"},
                                 "machine-b": {"logits": "b-logits", "decoded": "b-decoded", "waveform": "b-waveform"}})
    assert goldens.compare_point(observed, golden, "machine-a") == [
        "decoded: sha256 differs (exact, recorded for this machine)"]
    assert goldens.compare_point(observed, golden, "machine-b") == [
        f"decoded: no sha256 recorded for this machine {RECORD}",
        f"waveform: no sha256 recorded for this machine {RECORD}"]
    # a golden with no hashes at all, or none for this key: only the portable parts are compared
    bare = {k: v for k, v in made_point().items() if k != "exact"}
    assert goldens.compare_point(observed, bare, "machine-a") == []
    assert goldens.compare_point(observed, golden, "machine-c") == []


def test_compare_point_names_a_portable_summary_the_goldens_lack_with_the_command_that_records_it():
    golden = {k: v for k, v in made_point().items() if k != "waveform_rms"}
    assert goldens.compare_point(made_point(), golden) == [f"waveform_rms: not in the goldens {RECORD}"]


def test_compare_covers_the_points_of_both_sides_and_matching_keeps_the_versions_equal_everywhere():
    observed = {"auto": made_point(), "clone": made_point(), "design": made_point()}
    same = {"omnivoice": "0.2.1", "points": {"auto": made_point(), "clone": made_point(), "design": made_point()}}
    other = {"omnivoice": "0.2.0", "points": {"auto": made_point(scoring_calls=31), "clone": made_point(),
                                              "saved": made_point()}}
    assert goldens.compare(observed, other) == {"auto": ["scoring_calls: 32 vs 31"], "clone": [],
                                                "design": ["not in the goldens"], "saved": ["not recorded"]}
    differences = goldens.match_versions(observed, {"0.2.0": other, "0.2.1": same, "0.1.5": same})
    assert differences == {"0.2.0": goldens.compare(observed, other), "0.2.1": {"auto": [], "clone": [], "design": []},
                           "0.1.5": {"auto": [], "clone": [], "design": []}}
    assert goldens.matching(differences) == ["0.1.5", "0.2.1"]
    assert goldens.matching({"0.2.0": differences["0.2.0"]}) == []


def test_exact_keys_are_the_numerics_keys_every_point_holds_hashes_for():
    def file(*per_point):
        return {"points": {f"p{i}": ({"exact": dict.fromkeys(keys, {})} if keys is not None else {})
                           for i, keys in enumerate(per_point)}}

    assert goldens.exact_keys(file(["k3", "k1", "k2"], ["k2", "k3", "k1"], ["k3", "k1"])) == ["k1", "k3"]
    assert goldens.exact_keys(file(["k1"], None)) == []  # a point without hashes: no key is complete
    assert goldens.exact_keys(file()) == []


def recorded_file() -> dict:
    """A goldens file as an older suite wrote it: one point without waveform RMS, one without any hashes."""
    return {"omnivoice": "0.2.1", "points": {
        "auto": made_point(exact={"machine-a": hashes("a")}),
        "clone": {k: v for k, v in made_point().items() if k not in ("waveform_rms", "exact")}}}


def test_merging_adds_this_machines_hashes_and_missing_summaries_and_keeps_the_recorded_ones():
    # our auto point's RMS moved within its tolerance: the recorded figures stay, ours only fill what is missing
    ours = {"omnivoice": "0.2.1", "points": {"auto": made_point(waveform_rms=[[0.5, 0.25 + 1e-7]],
                                                                exact={"machine-b": hashes("b")}),
                                             "clone": made_point(waveform_rms=[[0.5, 0.25 + 1e-7]],
                                                                 exact={"machine-b": hashes("b")})}}
    recorded = recorded_file()
    merged = goldens.merge_goldens(ours, recorded)
    assert merged == {"omnivoice": "0.2.1", "points": {
        "auto": made_point(exact={"machine-a": hashes("a"), "machine-b": hashes("b")}),
        "clone": made_point(waveform_rms=[[0.5, 0.25 + 1e-7]], exact={"machine-b": hashes("b")})}}
    assert recorded == recorded_file(), "the recorded goldens must not be changed in place"


def test_merging_refuses_goldens_whose_portable_parts_or_points_differ_naming_them():
    tail = "; this is a change of behaviour, not of bits: find out why before replacing the file (--replace)"
    head = "omnivoice 0.2.1: the portable parts differ from the recorded goldens ("
    moved = {"omnivoice": "0.2.1", "points": {"auto": made_point(scoring_calls=33), "clone": made_point()}}
    with pytest.raises(goldens.GoldensError) as err:
        goldens.merge_goldens(moved, recorded_file())
    assert str(err.value) == head + "{'auto': ['scoring_calls: 33 vs 32']})" + tail
    fewer = {"omnivoice": "0.2.1", "points": {"auto": made_point()}}
    with pytest.raises(goldens.GoldensError) as err:
        goldens.merge_goldens(fewer, recorded_file())
    assert str(err.value) == head + " points ['clone'])" + tail
    both = {"omnivoice": "0.2.1", "points": {"auto": made_point(scoring_calls=33), "saved": made_point()}}
    with pytest.raises(goldens.GoldensError) as err:
        goldens.merge_goldens(both, recorded_file())
    assert str(err.value) == head + "{'auto': ['scoring_calls: 33 vs 32']} points ['clone', 'saved'])" + tail
