"""theory.schedules: the simulator must reproduce the papers' bubble formulas, by simulation."""

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partrain_edu.theory.schedules import Action, Schedule, bubble_formula, build_schedule, simulate


def test_must_show_1f1b_4_stages_8_microbatches():
    r = simulate(build_schedule("1f1b", 4, 8))
    assert r.makespan == 33.0                       # (m + p − 1)(F + B) = 11 · 3
    assert r.bubble_fraction == pytest.approx(3 / 11, abs=1e-15)
    assert r.peak_activations == (4, 3, 2, 1)
    d = r.to_dict()
    assert set(d) == {"makespan", "bubble_fraction", "peak_activations", "events"}
    assert d["peak_activations"] == [4, 3, 2, 1]
    assert set(d["events"][0]) == {"stage", "microbatch", "chunk", "kind", "start", "end"}
    assert len(d["events"]) == 4 * 8 * 2


GRID = [(p, m) for p in (1, 2, 3, 4, 6, 8) for m in (1, 2, 3, 4, 5, 8, 13, 16, 32)]
COSTS = [(1, 2), (1, 1), (2, 3), (0.5, 1.5)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", GRID)
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, p, m):
    for f, b in COSTS:
        r = simulate(build_schedule(name, p, m), t_forward=f, t_backward=b)
        assert r.bubble_fraction == pytest.approx(float(Fraction(p - 1, m + p - 1)), abs=1e-12)
        assert r.makespan == pytest.approx((m + p - 1) * (f + b))


@pytest.mark.parametrize("p, m", GRID)
def test_naive_runs_the_whole_batch_through_one_stage_at_a_time(p, m):
    r = simulate(build_schedule("naive", p, m), t_forward=1, t_backward=2)
    assert r.makespan == p * m * 3
    assert r.bubble_fraction == pytest.approx((p - 1) / p, abs=1e-12)
    assert r.peak_activations == (m,) * p


@pytest.mark.parametrize("p, k, v", [(p, k, v) for p in (2, 3, 4, 8) for k in (1, 2, 3) for v in (2, 3, 4)])
def test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(p, k, v):
    m = k * p
    for f, b in COSTS:
        r = simulate(build_schedule("interleaved", p, m, chunks=v), t_forward=f, t_backward=b)
        assert r.bubble_fraction == pytest.approx(float(Fraction(p - 1, v * m + p - 1)), abs=1e-12)


@pytest.mark.parametrize("p, m", [(p, m) for p, m in GRID if m >= p])
@pytest.mark.parametrize("f, b, w", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5), (3, 2, 1)])
def test_zb_h1_idle_is_p_minus_1_times_f_plus_b_minus_w(p, m, f, b, w):
    # Qi et al. 2024 §2.1 (holds for m >= p and W <= F, which includes their F = B = W).
    zb = simulate(build_schedule("zb-h1", p, m), f, b, w)
    one_f_one_b = simulate(build_schedule("1f1b", p, m), f, b, w)  # runs B and W together
    for idle_zb, idle_1f1b in zip(zb.idle, one_f_one_b.idle, strict=True):
        assert idle_zb == pytest.approx((p - 1) * (f + b - w))
        assert idle_1f1b == pytest.approx((p - 1) * (f + b + w))
    assert max(zb.peak_activations) == p == max(one_f_one_b.peak_activations)  # same peak memory


def test_zb_h1_bubble_is_one_third_of_1f1b_when_f_b_w_equal():
    zb = simulate(build_schedule("zb-h1", 4, 8), 1, 1, 1)
    base = simulate(build_schedule("1f1b", 4, 8), 1, 1, 1)
    assert sum(zb.idle) * 3 == sum(base.idle) == 36
    assert zb.makespan == 27 and base.makespan == 33


def test_peak_activations_by_schedule():
    assert simulate(build_schedule("gpipe", 4, 8)).peak_activations == (8, 8, 8, 8)
    assert simulate(build_schedule("1f1b", 4, 2)).peak_activations == (2, 2, 2, 1)
    # interleaved stage 0 warms up (p−1)·2 + (v−1)·p chunk-forwards, then one more (Megatron-LM)
    assert simulate(build_schedule("interleaved", 4, 8, 2)).peak_activations[0] == 3 * 2 + 4 + 1


def test_slow_last_stage_sets_the_pace():
    # Load imbalance (source notes, pitfall 2): stage 3 takes twice as long. The first forward reaches it
    # after 3F, it then works m·(F+B)·2 without a break, and the last backward climbs 3 stages: 3B.
    r = simulate(build_schedule("1f1b", 4, 8), 1, 2, stage_costs=[1, 1, 1, 2])
    assert r.makespan == 3 * 1 + 8 * 3 * 2 + 3 * 2
    assert r.idle[3] == 3 * 1 + 3 * 2


def test_inflight_curve_starts_and_ends_empty():
    r = simulate(build_schedule("gpipe", 3, 5))
    for s, curve in enumerate(r.inflight):
        assert curve[0] == (0.0, 0) and curve[-1][1] == 0
        assert max(h for _, h in curve) == r.peak_activations[s]


def test_a_learner_schedule_that_deadlocks_is_reported():
    bad = Schedule("mine", 2, 1, 1, ((Action("F", 0), Action("B", 0)), (Action("B", 0), Action("F", 0))))
    with pytest.raises(ValueError, match="deadlocks: .*stage 1 waits at B0"):
        simulate(bad)
    missing = Schedule("mine", 1, 2, 1, ((Action("F", 0), Action("B", 0)),))
    with pytest.raises(ValueError, match="exactly once"):
        simulate(missing)


@pytest.mark.parametrize("args, words", [
    (("interleaved", 4, 6, 2), "multiple of --stages 4"),
    (("interleaved", 4, 8, 1), "--chunks 2 or more"),
    (("1f1b", 4, 8, 2), "--chunks only applies"),
    (("pipedream", 4, 8), "--schedule must be one of"),
    (("gpipe", 0, 8), "--stages must be a positive"),
    (("gpipe", 4, -1), "--microbatches must be a positive"),
])
def test_bad_input_raises_one_line(args, words):
    with pytest.raises(ValueError) as err:
        build_schedule(*args)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_bad_costs_raise():
    with pytest.raises(ValueError, match="must be numbers >= 0"):
        simulate(build_schedule("1f1b", 2, 2), t_forward=-1)
    with pytest.raises(ValueError, match="one number per stage"):
        simulate(build_schedule("1f1b", 2, 2), stage_costs=[1])


names = st.sampled_from(["naive", "gpipe", "1f1b", "zb-h1"])
cost = st.sampled_from([0.5, 1, 1.5, 2, 3])


@settings(max_examples=60, deadline=None)
@given(name=names, p=st.integers(1, 6), m=st.integers(1, 12), f=cost, b=cost, w=st.sampled_from([0, 0.5, 1]),
       imbalance=st.lists(st.sampled_from([1, 1.5, 2]), min_size=6, max_size=6))
def test_simulator_honours_every_dependency(name, p, m, f, b, w, imbalance):
    r = simulate(build_schedule(name, p, m), f, b, w, stage_costs=imbalance[:p])
    end = {(e.kind, e.microbatch, e.stage): e.end for e in r.events}
    last = {}
    for e in r.events:
        assert e.start >= last.get(e.stage, 0)  # a stage runs one thing at a time, in order
        last[e.stage] = e.end
        if e.kind == "F" and e.stage > 0:
            assert e.start >= end["F", e.microbatch, e.stage - 1]
        if e.kind == "B":
            assert e.start >= end["F", e.microbatch, e.stage]
            if e.stage < p - 1:
                assert e.start >= end["B", e.microbatch, e.stage + 1]
        if e.kind == "W":
            assert e.start >= end["B", e.microbatch, e.stage]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b"]), p=st.integers(2, 8), m=st.integers(1, 30), f=cost, b=cost)
def test_bubble_falls_as_microbatches_grow(name, p, m, f, b):
    fewer = simulate(build_schedule(name, p, m), f, b).bubble_fraction
    more = simulate(build_schedule(name, p, m + 1), f, b).bubble_fraction
    assert more < fewer


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 6), k=st.integers(1, 4), v=st.integers(2, 4))
def test_interleaved_bubble_falls_as_microbatches_grow(p, k, v):
    fewer = simulate(build_schedule("interleaved", p, k * p, v)).bubble_fraction
    more = simulate(build_schedule("interleaved", p, (k + 1) * p, v)).bubble_fraction
    assert more < fewer


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 16), f=cost, b=cost, w=cost,
       imbalance=st.lists(st.sampled_from([1, 1.5, 2]), min_size=8, max_size=8))
def test_zb_h1_never_slower_than_1f1b(p, m, f, b, w, imbalance):
    zb = simulate(build_schedule("zb-h1", p, m), f, b, w, stage_costs=imbalance[:p])
    base = simulate(build_schedule("1f1b", p, m), f, b, w, stage_costs=imbalance[:p])
    assert zb.makespan <= base.makespan
    assert zb.bubble_fraction <= base.bubble_fraction + 1e-12


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 20))
def test_gpipe_holds_m_and_1f1b_at_most_p(p, m):
    assert simulate(build_schedule("gpipe", p, m)).peak_activations == (m,) * p
    peaks = simulate(build_schedule("1f1b", p, m)).peak_activations
    assert peaks == tuple(min(p - s, m) for s in range(p))
    assert max(peaks) <= p


@pytest.mark.parametrize("costs", [(1.3e-3, 1.5e-3, 1.1e-3), (1e-4, 1e-4, 1e-4), (2.8, 3.4, 2.2)])
def test_the_zb_h1_formula_keeps_the_ratio_of_costs_given_in_seconds(costs):
    """The closed form equals the simulator's bubble whatever the unit of F, B, W (costs under 1 ms once
    rounded to 0, dividing by zero)."""
    formula = bubble_formula("zb-h1", 4, 8, 1, *costs)[1]
    assert math.isclose(float(formula), simulate(build_schedule("zb-h1", 4, 8), *costs).bubble_fraction,
                        rel_tol=1e-9)
