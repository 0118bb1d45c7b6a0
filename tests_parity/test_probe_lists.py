"""What the two probes of the packed layout measure, against recording stand-ins for the kernels (no model): which
(queries, keys) cuts `loop.attention_cut` tries and in what order, which row counts `loop.row_count` tries (its scan
above the least, then its bisection), what each probe call is given, and what is remembered. The expected lists are
written out by hand from the docstrings' rules, so a changed block size, bound or step shows as another list.
tests_parity/test_probes.py checks the same probes on the real kernels (their answers keep stock's bits)."""

from __future__ import annotations

import pytest
import torch

from fastpath import loop

# --- attention_cut ---------------------------------------------------------------------------------------------------

HEADS, KV_HEADS, D = 4, 2, 4


class Attention:
    """A stand-in attention function: records the (Q, K) of every call and what it was given; its output [1, Q, heads,
    d] on the first n rows is stock's (zeros) at stock's own width P and where `exact(Q, K)` allows, ones elsewhere;
    the rows past n hold Q, so only the real queries can match stock's."""

    def __init__(self, P: int, n: int, exact=lambda Q, K: False):
        self.P, self.n, self.exact = P, n, exact
        self.calls, self.given = [], []

    def __call__(self, module, q, k, v, mask, **kwargs):
        Q, K = q.size(2), k.size(2)
        self.calls.append((Q, K))
        self.given.append(dict(module=module, q=q, k=k, v=v, mask=mask, kwargs=kwargs))
        stock = (Q, K) == (self.P, self.P) or self.exact(Q, K)
        out = torch.full((1, Q, q.size(1), q.size(3)), 0.0 if stock else 1.0)
        out[:, self.n :] = Q
        return out, None


def row_mask(P: int, n: int) -> torch.Tensor:
    """A row's mask as unpacked_attention passes it ([1, 1, P, P]): n real queries over n keys, padding on itself."""
    mask = torch.zeros(1, 1, P, P, dtype=torch.bool)
    mask[..., :n, :n] = True
    mask[0, 0, torch.arange(n, P), torch.arange(n, P)] = True
    return mask


def cut(monkeypatch, P: int, n: int, exact=lambda Q, K: False, kwargs=None, mask=None, dtype=torch.float32):
    """loop.attention_cut over the stand-in, from an empty memo -> (its answer, the stand-in)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kernel = Attention(P, n, exact)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "stand_in", kernel)
    monkeypatch.setattr(loop, "_ATTENTION_CUTS", {})  # its memo is keyed by shapes, not by the kernel
    query, key = torch.zeros(1, HEADS, P, D, dtype=dtype), torch.zeros(1, KV_HEADS, P, D, dtype=dtype)
    mask = row_mask(P, n) if mask is None else mask
    return loop.attention_cut("stand_in", "module", query, key, mask, n, kwargs or {}), kernel


# (P, n, the calls when no cut is exact: stock's (P, P) first, then the list in order)
CUT_LISTS = [
    # below 192 queries stock's flash kernel runs 32-query blocks: queries rounded up to 32, keys to 64, 512, P
    pytest.param(100, 40, [(64, 64), (64, 100)], id="P100-32-query-blocks"),
    # from 192: 64-query blocks, and the second query count keeps them (at least 192 queries)
    pytest.param(200, 40, [(64, 64), (64, 200), (192, 192), (192, 200)], id="P200-64-query-blocks"),
    pytest.param(767, 300, [(320, 320), (320, 512), (320, 767)], id="P767-64-query-blocks"),
    # from 768: 256-query blocks, at least 768 queries
    pytest.param(768, 40, [(64, 64), (64, 512), (64, 768)], id="P768-256-query-blocks"),
    pytest.param(769, 40, [(64, 64), (64, 512), (64, 769), (768, 768), (768, 769)], id="P769-256-query-blocks"),
    pytest.param(1100, 600, [(608, 640), (608, 1024), (608, 1100), (768, 768), (768, 1024), (768, 1100)],
                 id="P1100-n600"),
    pytest.param(1100, 800, [(800, 832), (800, 1024), (800, 1100), (1024, 1024), (1024, 1100)], id="P1100-n800"),
]


@pytest.mark.parametrize("P, n, tried", CUT_LISTS)
def test_attention_cut_tries_its_list_in_order_after_stocks_width(monkeypatch, P, n, tried):
    got, kernel = cut(monkeypatch, P, n)
    assert kernel.calls == [(P, P)] + tried, f"P={P}, n={n}: tried {kernel.calls[1:]}, the list is {tried}"
    assert got == (P, P), "no cut is exact: stock's whole width"


@pytest.mark.parametrize("P, n, tried", CUT_LISTS)
def test_attention_cut_takes_the_first_exact_cut_of_its_list(monkeypatch, P, n, tried):
    """Exact from the last cut of the list on (by its place in the list): that one is the answer, nothing after it is
    tried; exact only at the first: it is the answer."""
    last = tried[-1]
    got, kernel = cut(monkeypatch, P, n, exact=lambda Q, K: (Q, K) == last)
    assert (got, kernel.calls) == (last, [(P, P)] + tried)
    got, kernel = cut(monkeypatch, P, n, exact=lambda Q, K: (Q, K) == tried[0])
    assert (got, kernel.calls) == (tried[0], [(P, P), tried[0]])


@pytest.mark.parametrize("P, n", [(32, 20), (40, 33), (64, 64)], ids=["P32", "P40-n33", "n-is-P"])
def test_a_row_whose_every_cut_is_its_whole_width_measures_nothing(monkeypatch, P, n):
    """Rounded up, every cut on the list reaches P: the answer is (P, P) and the kernel is not called."""
    got, kernel = cut(monkeypatch, P, n)
    assert (got, kernel.calls) == ((P, P), [])


def test_attention_cut_probes_in_stocks_memory_order_with_the_rows_mask_and_keywords(monkeypatch):
    """Each probe call gets the module, the keywords, the row's mask cut to (Q, K), and random queries, keys and
    values of the row's heads, head size and dtype, laid out as stock's [1, P, heads, d] batch transposed; the global
    random stream is left alone (the probe runs inside a generate whose draws must stay upstream's)."""
    P, n = 200, 40
    mask = row_mask(P, n)
    mask[0, 0, 3, 150] = True  # a mask only this row has: every cut must carry it
    rng = torch.random.get_rng_state()
    _, kernel = cut(monkeypatch, P, n, kwargs={"scaling": 0.5, "dropout": 0.0}, mask=mask, dtype=torch.bfloat16)
    assert torch.equal(torch.random.get_rng_state(), rng), "attention_cut drew from the global random stream"
    assert len(kernel.given) == 5
    for (Q, K), given in zip(kernel.calls, kernel.given):
        q, k, v = given["q"], given["k"], given["v"]
        assert given["module"] == "module" and given["kwargs"] == {"scaling": 0.5, "dropout": 0.0}
        assert (tuple(q.shape), tuple(k.shape), tuple(v.shape)) == ((1, HEADS, Q, D), (1, KV_HEADS, K, D),
                                                                    (1, KV_HEADS, K, D))
        assert {q.dtype, k.dtype, v.dtype} == {torch.bfloat16}
        assert all(t.transpose(1, 2).is_contiguous() and not t.is_contiguous() for t in (q, k, v)), "not stock's order"
        assert torch.equal(given["mask"], mask[..., :Q, :K])
    generator = torch.Generator().manual_seed(0)  # one seeded draw: the same probe in every process
    drawn = [torch.randn(1, P, heads, D, generator=generator).to(torch.bfloat16).transpose(1, 2)
             for heads in (HEADS, KV_HEADS, KV_HEADS)]
    first, second = kernel.given[0], kernel.given[1]
    assert all(torch.equal(first[name], t) for name, t in zip("qkv", drawn)), "not the seeded queries, keys, values"
    assert torch.equal(second["q"], first["q"][:, :, :64]), "the cuts are of one draw: a row's queries and keys"


def test_attention_cut_remembers_its_answer_per_row_shape_mask_and_scaling(monkeypatch):
    """The same row again: the answer, no call. Another scaling, mask, length or dtype: measured again."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    P, n = 200, 40
    kernel = Attention(P, n, exact=lambda Q, K: Q >= 192)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "stand_in", kernel)
    monkeypatch.setattr(loop, "_ATTENTION_CUTS", {})

    def ask(P=P, n=n, scaling=0.5, mask=None, dtype=torch.float32):
        kernel.P, kernel.n, kernel.calls = P, n, []
        query, key = torch.zeros(1, HEADS, P, D, dtype=dtype), torch.zeros(1, KV_HEADS, P, D, dtype=dtype)
        got = loop.attention_cut("stand_in", None, query, key, row_mask(P, n) if mask is None else mask, n,
                                 {"scaling": scaling})
        return got, len(kernel.calls)

    assert ask() == ((192, 192), 4)
    assert ask() == ((192, 192), 0), "the same row measured again"
    assert ask(scaling=0.25) == ((192, 192), 4), "another scaling: not measured"
    other = row_mask(P, n)
    other[0, 0, 3, 150] = True
    assert ask(mask=other) == ((192, 192), 4), "another mask: not measured"
    assert ask(n=20) == ((192, 192), 4), "another length: not measured"
    assert ask(P=100, n=20)[1] == 3, "another width: not measured"
    assert ask(dtype=torch.bfloat16)[1] == 4, "another dtype: not measured"


# --- row_count -------------------------------------------------------------------------------------------------------


class Gemm:
    """A stand-in for nn.functional.linear: a call of `exact(rows, weight shape)` rows (or stock's own call, the first
    per weight) gives the real bits, any other every output one ulp off. Records (rows, weight shape) of every call
    after stock's."""

    def __init__(self, exact, stock_calls: int):
        self.exact, self.stock_calls, self.calls = exact, stock_calls, []
        self.real = torch.nn.functional.linear

    def __call__(self, x, w, bias=None):
        out = self.real(x, w, bias)
        if self.stock_calls > 0:
            self.stock_calls -= 1
            return out
        self.calls.append((x.size(0), tuple(w.shape)))
        return out if self.exact(x.size(0), tuple(w.shape)) else torch.nextafter(out, out + 1)


def count(monkeypatch, exact, stock_count: int, least: int, rows=None, shapes=((5, 3),)):
    """loop.row_count over the stand-in, from an empty memo -> (its answer, the row counts it tried in order)."""
    gemm = Gemm(lambda n, shape: exact(n), len(shapes))
    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    monkeypatch.setattr(loop, "_ROW_COUNTS", {})
    weights = [torch.randn(*shape, generator=torch.Generator().manual_seed(9)) for shape in shapes]
    rows = torch.arange(least) if rows is None else rows
    found = loop.row_count(weights, rows, stock_count, least)
    return found, gemm.calls


ROW_SCANS = [
    # found in the scan: least, least + 1, ... until one is exact
    pytest.param(20, 64, lambda n: n >= 23, 23, [20, 21, 22, 23], id="found-in-the-scan"),
    # the scan stops at stock's count, and a call of stock's count with other rows need not be exact
    pytest.param(4, 6, lambda n: False, None, [4, 5, 6], id="scan-capped-at-stock"),
    # the scan's last count is least + PROBE_SCAN - 1; stock's count just past it is tried once, and is the answer
    pytest.param(4, 12, lambda n: n >= 12, 12, [4, 5, 6, 7, 8, 9, 10, 11, 12], id="stock-just-past-the-scan"),
    # nothing in the scan, and stock's count with these rows not exact either: no bisection, None
    pytest.param(4, 64, lambda n: False, None, [4, 5, 6, 7, 8, 9, 10, 11, 64], id="none"),
    # bisection between the scan's last count (11) and stock's (64), each count measured once
    pytest.param(4, 64, lambda n: n >= 12, 12, [4, 5, 6, 7, 8, 9, 10, 11, 64, 37, 24, 17, 14, 12], id="bisect-low"),
    pytest.param(4, 63, lambda n: n >= 50, 50, [4, 5, 6, 7, 8, 9, 10, 11, 63, 37, 50, 43, 46, 48, 49],
                 id="bisect-high"),
]


@pytest.mark.parametrize("least, stock_count, exact, want, tried", ROW_SCANS)
def test_row_count_scans_then_bisects_measuring_each_count_once(monkeypatch, least, stock_count, exact, want, tried):
    assert loop.PROBE_SCAN == 8, "the lists below are written for a scan of 8 counts"
    found, calls = count(monkeypatch, exact, stock_count, least)
    assert [n for n, _ in calls] == tried, f"counts tried {[n for n, _ in calls]}, expected {tried}"
    assert found == want
    assert len(set(tried)) == len(tried)


def test_a_count_is_exact_only_for_every_weight_and_stops_at_the_first_that_is_not(monkeypatch):
    """Two weights: (5, 3) exact from 6 rows, (7, 3) from 9; a count is tried on the second only where the first
    passed, and the answer is the least count exact for both."""
    exact = {(n, (5, 3)): n >= 6 for n in range(100)} | {(n, (7, 3)): n >= 9 for n in range(100)}
    gemm = Gemm(lambda n, shape: exact[(n, shape)], 2)
    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    monkeypatch.setattr(loop, "_ROW_COUNTS", {})
    weights = [torch.randn(5, 3), torch.randn(7, 3, generator=torch.Generator().manual_seed(9))]
    assert loop.row_count(weights, torch.arange(4), 64, 4) == 9
    assert gemm.calls == [(4, (5, 3)), (5, (5, 3)), (6, (5, 3)), (6, (7, 3)), (7, (5, 3)), (7, (7, 3)), (8, (5, 3)),
                          (8, (7, 3)), (9, (5, 3)), (9, (7, 3))]


def test_row_count_places_the_stock_rows_first_and_fills_from_the_first_inputs(monkeypatch):
    """A probe call of count c is stock's rows (here 1, 3, 5 of a 10-row call) at 0..n-1, then the first c - n inputs,
    and its first n outputs are compared with stock's rows."""
    seen = []
    real = torch.nn.functional.linear

    def gemm(x, w, bias=None):  # row by row: every row's bits whatever the count
        seen.append(x.clone())
        return torch.cat([real(row[None], w, bias) for row in x])

    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    monkeypatch.setattr(loop, "_ROW_COUNTS", {})
    rows = torch.tensor([1, 3, 5])
    assert loop.row_count([torch.randn(5, 3)], rows, 10, 5) == 5  # exact at once: the least
    stock, probe = seen
    assert (stock.shape, probe.shape) == ((10, 3), (5, 3))
    assert torch.equal(stock, torch.randn(10, 3, generator=torch.Generator().manual_seed(0))), "not the seeded rows"
    assert torch.equal(probe, torch.cat([stock[rows], stock[:2]]))


def test_where_nothing_is_trimmed_row_count_measures_nothing(monkeypatch):
    """least = stock's count and every row of stock's call: the answer is the least, unmeasured; the same count with
    fewer rows is measured."""
    found, calls = count(monkeypatch, lambda n: False, 6, 6, rows=torch.arange(6))
    assert (found, calls) == (6, [])
    found, calls = count(monkeypatch, lambda n: False, 6, 6, rows=torch.arange(3))
    assert (found, [n for n, _ in calls]) == (None, [6])


def test_row_count_remembers_its_answers_and_forgets_past_512(monkeypatch):
    """The same question again: answered from the memo, no call. The memo holds 512 answers and one more; the next
    one clears it first. The global random stream is left alone."""
    gemm = Gemm(lambda n, shape: n >= 6, 1)
    monkeypatch.setattr(torch.nn.functional, "linear", gemm)
    memo = {("filler", i): i for i in range(511)}
    monkeypatch.setattr(loop, "_ROW_COUNTS", memo)
    w, rng = torch.randn(5, 3), torch.random.get_rng_state()
    assert loop.row_count([w], torch.arange(4), 64, 4) == 6
    assert torch.equal(torch.random.get_rng_state(), rng), "row_count drew from the global random stream"
    calls = len(gemm.calls)
    assert loop.row_count([w], torch.arange(4), 64, 4) == 6 and len(gemm.calls) == calls, "asked twice, measured twice"
    assert len(memo) == 512
    gemm.stock_calls = 1
    assert loop.row_count([w], torch.arange(4), 64, 5) == 6 and len(memo) == 513, "cleared at 512 answers"
    gemm.stock_calls = 1
    assert loop.row_count([w], torch.arange(4), 64, 6) == 6 and len(memo) == 1, "not cleared past 512 answers"
    for other in (dict(stock_count=63), dict(rows=torch.tensor([0, 1, 2, 5])), dict(rows=torch.arange(3))):
        gemm.stock_calls, calls = 1, len(gemm.calls)
        args = dict(rows=torch.arange(4), stock_count=64) | other
        loop.row_count([w], args["rows"], args["stock_count"], 6)
        assert len(gemm.calls) > calls, f"{other}: answered from another question's memo"
