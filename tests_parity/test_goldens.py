"""Stock OmniVoice on the tiny checkpoint against the goldens of the known omnivoice versions (fixtures/goldens/).

The goldens say what stock computes (final tokens, sha256 of per-step logits and of the waveform) at each parity
point, 8 steps, seed 0. A failure here means stock behaviour on the installed omnivoice is none of the known
ones: the message lists, per known version and point, which parts differ. Record the installed version's
goldens with `python -m fastpath.testing.goldens --record` once the change is understood.
"""

from __future__ import annotations

import copy

import pytest

from fastpath.testing import goldens


@pytest.fixture(scope="module")
def observed(model, checkpoint):
    if checkpoint.kind != "tiny":
        pytest.skip(f"goldens are recorded on the tiny test checkpoint; this run uses the {checkpoint.kind} one")
    return goldens.record_goldens(model)


@pytest.fixture(scope="module")
def known():
    found = goldens.load_goldens()
    assert found, f"no goldens in {goldens.GOLDENS_DIR}: run `python -m fastpath.testing.goldens --record`"
    return found


@pytest.mark.cpu
def test_stock_matches_the_goldens_of_a_known_version(observed, known, checkpoint):
    differences = goldens.match_versions(observed, known)
    same = goldens.matching(differences)
    report = goldens.describe(differences, known, goldens.environment(), goldens.checkpoint_identity(checkpoint.path))
    print(report)
    assert same, report


def test_goldens_of_every_version_were_made_with_the_same_weights(known, checkpoint):
    """The tiny checkpoint's cache key includes the omnivoice version, but its weights must not depend on it."""
    digests = {version: goldens.weight_digests(data) for version, data in known.items()}
    assert len({tuple(sorted(d.items())) for d in digests.values()}) == 1, digests
    if checkpoint.kind == "tiny":
        here = goldens.checkpoint_identity(checkpoint.path)
        assert here == next(iter(digests.values())), f"this tiny checkpoint {here} vs the goldens' {digests}"


def test_goldens_cover_every_parity_point(known):
    from fastpath.testing.parity import POINTS

    for version, data in known.items():
        assert set(data["points"]) == set(POINTS), f"{version}: {sorted(set(POINTS) ^ set(data['points']))}"
        assert data["settings"]["num_step"] == goldens.NUM_STEP and data["settings"]["seed"] == goldens.SEED


def test_comparison_names_each_part_that_moved(known):
    version, data = sorted(known.items())[-1]
    other = copy.deepcopy(data["points"])
    point = sorted(other)[0]
    other[point]["tokens"][0][0][0] += 1
    other[point]["logits"] = "0" * 64
    differences = goldens.match_versions(other, {version: data})
    assert goldens.matching(differences) == []
    parts = differences[version][point]
    assert any(p.startswith("tokens: 1/") for p in parts) and "logits: sha256 differs" in parts, parts
    assert not any(differences[version][p] for p in other if p != point)
    assert f"{point}: tokens: 1/" in goldens.describe(differences, {version: data}, data["environment"])
