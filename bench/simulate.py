"""Seeded generator of realistic Anki users in the anki-revlogs-10k revlog layout (for benchmarks and tests).

One user = one call `simulate_user(n_reviews, seed)`:
- a "true" memory model: FSRS-6 with parameters drawn log-normally around the published defaults (clipped to the
  bounds), which decides whether each review is recalled;
- an Anki-like scheduler that does NOT know the truth: it tracks FSRS-6 states with the default parameters and
  schedules the next review at its desired retention (drawn in [0.85, 0.95]) with ±5 % fuzz; the user sometimes
  reviews late (overdue) or early-ish;
- learning steps 1 min / 10 min for new cards and one 10 min relearning step after a lapse, so cards get same-day
  reviews (elapsed_days 0) with states 1 (learning) and 3 (relearning);
- ratings: a failure is Again; a success is Hard / Good / Easy with user-specific frequencies (≈ 7 % / 85 % / 6 %
  of passes); first ratings ≈ 20 % Again, 8 % Hard, 60 % Good, 12 % Easy; overall Again lands at ≈ 10–15 %;
- new cards per day drawn per user (8–30); the simulation runs day by day until n_reviews reviews exist.

The day loop is a numba kernel (all cards per day); 400k reviews take well under a second after compilation.

Columns (rows in time order): card_id, day_offset, rating, state, duration, elapsed_days, elapsed_seconds.
First review of a card: state 0, elapsed_days −1, elapsed_seconds −1.

CLI: python -m bench.simulate --out DIR --reviews 100000 --users 3 --seed 0 → DIR/revlogs/user_id=N/data.parquet
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: numba's cached kernels refer to the module as bench.simulate
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import bench.simulate

    sys.exit(bench.simulate.main())

import numpy as np
import pandas as pd
from numba import njit

DEFAULT_W = np.array([0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796,
                      1.4835, 0.0614, 0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542])
LOWER = np.array([0.001] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1, 0, 0, 0.01, 0.1])
UPPER = np.array([100.0] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, 2, 2, 0.8, 0.8])


def draw_parameters(rng: np.random.Generator) -> np.ndarray:
    """A user's true FSRS-6 parameters: log-normal spread around the defaults, S0 increasing, clipped."""
    w = DEFAULT_W * np.exp(rng.normal(0.0, 0.3, 21))
    w[:4] = np.sort(DEFAULT_W[:4] * np.exp(rng.normal(0.0, 0.5, 4)))
    w[7] = rng.uniform(0.001, 0.05)
    w[20] = rng.uniform(0.12, 0.5)
    return np.clip(w, LOWER, UPPER)


@njit(cache=True)
def _r(w, t, s):
    d = w[20]
    f = 0.9 ** (-1.0 / d) - 1.0
    return (1.0 + f * t / s) ** (-d)


@njit(cache=True)
def _step(w, s, dd, t, g, first):
    """FSRS-6 state after a review (G >= 3 short-term floor, like the benchmark's FSRS6 class)."""
    if first:
        ns = w[g - 1]
        nd = w[4] - math.exp(w[5] * (g - 1)) + 1.0
    else:
        if t < 1.0:
            sinc = math.exp(w[17] * (g - 3 + w[18])) * s ** (-w[19])
            if g >= 3 and sinc < 1.0:
                sinc = 1.0
            ns = s * sinc
        elif g > 1:
            r = _r(w, t, s)
            hb = w[15] if g == 2 else (w[16] if g == 4 else 1.0)
            ns = s * (1.0 + math.exp(w[8]) * (11.0 - dd) * s ** (-w[9]) * (math.exp(w[10] * (1.0 - r)) - 1.0) * hb)
        else:
            r = _r(w, t, s)
            sf = w[11] * dd ** (-w[12]) * ((s + 1.0) ** w[13] - 1.0) * math.exp(w[14] * (1.0 - r))
            ns = min(sf, s / math.exp(w[17] * w[18]))
        d04 = w[4] - math.exp(3.0 * w[5]) + 1.0
        nd = w[7] * d04 + (1.0 - w[7]) * (dd - w[6] * (g - 3) * (10.0 - dd) / 9.0)
    return min(max(ns, 0.001), 36500.0), min(max(nd, 1.0), 10.0)


@njit(cache=True)
def _pick(p):
    u = np.random.random()
    acc = 0.0
    for k in range(len(p)):
        acc += p[k]
        if u < acc:
            return k + 1
    return len(p)


@njit(cache=True)
def _simulate(n_reviews, seed, w_true, w_sched, retention, new_per_day, first_p, pass_p, late_p, same_day_fail,
              p_active=1.0):
    np.random.seed(seed)
    cap = n_reviews + 4096
    ev_card = np.empty(cap, dtype=np.int64)
    ev_day = np.empty(cap, dtype=np.int64)
    ev_sec = np.empty(cap, dtype=np.int64)  # seconds since the start of day 0
    ev_rating = np.empty(cap, dtype=np.int64)
    ev_state = np.empty(cap, dtype=np.int64)
    max_cards = n_reviews + 1
    due = np.full(max_cards, -1, dtype=np.int64)
    s_t = np.zeros(max_cards)
    d_t = np.zeros(max_cards)
    s_s = np.zeros(max_cards)
    d_s = np.zeros(max_cards)
    last_day = np.zeros(max_cards, dtype=np.int64)
    n_cards = 0
    n = 0
    day = 0
    fsched = 0.9 ** (-1.0 / w_sched[20]) - 1.0
    ifactor = (retention ** (-1.0 / w_sched[20]) - 1.0) / fsched
    while n < n_reviews:
        if p_active < 1.0 and np.random.random() >= p_active:  # no session today: due cards wait (overdue)
            day += 1
            continue
        session = 8 * 3600 + np.random.randint(0, 12 * 3600)  # when today's session starts
        # due review cards, then new cards (each card's same-day steps follow its first review today)
        n_new = new_per_day
        total = n_cards + n_new
        for c in range(total):
            if n >= cap - 16:
                break
            if c >= n_cards:
                if c >= max_cards:
                    break
                n_cards += 1
                is_new = True
            else:
                if due[c] > day:  # due today, or overdue after days without a session
                    continue
                is_new = False
            t_sec = session + np.random.randint(0, 3 * 3600)
            if is_new:
                g = _pick(first_p)
                s_t[c], d_t[c] = _step(w_true, 0.0, 0.0, 0.0, g, True)
                s_s[c], d_s[c] = _step(w_sched, 0.0, 0.0, 0.0, g, True)
                state = 0
                step = 0 if g <= 2 else 1  # Again/Hard: first step; Good: second step; Easy: graduate
                learning = g <= 3
            else:
                t = float(day - last_day[c])
                recalled = np.random.random() < _r(w_true, t, s_t[c])
                g = 1 if not recalled else 1 + _pick(pass_p)
                s_t[c], d_t[c] = _step(w_true, s_t[c], d_t[c], t, g, False)
                s_s[c], d_s[c] = _step(w_sched, s_s[c], d_s[c], t, g, False)
                state = 2
                step = 1
                learning = g == 1
            ev_card[n] = c
            ev_day[n] = day
            ev_sec[n] = day * 86400 + t_sec
            ev_rating[n] = g
            ev_state[n] = state
            n += 1
            relearn = not is_new
            k = 0
            while learning and k < 6 and n < cap - 1:
                k += 1
                t_sec += 60 if step == 0 else 600
                g = 1 if np.random.random() < same_day_fail else (3 if np.random.random() < 0.93 else 4)
                if np.random.random() < 0.05 and g == 3:
                    g = 2
                s_t[c], d_t[c] = _step(w_true, s_t[c], d_t[c], 0.0, g, False)
                s_s[c], d_s[c] = _step(w_sched, s_s[c], d_s[c], 0.0, g, False)
                ev_card[n] = c
                ev_day[n] = day
                ev_sec[n] = day * 86400 + t_sec
                ev_rating[n] = g
                ev_state[n] = 3 if relearn else 1
                n += 1
                if g == 1:
                    step = 0
                elif g == 3 or g == 4:
                    if step >= 1 or g == 4:
                        learning = False
                    else:
                        step = 1
            ivl = s_s[c] * ifactor * (0.95 + 0.1 * np.random.random())
            ivl = max(1.0, min(ivl, 36500.0))
            u = np.random.random()
            if u < late_p:
                ivl *= 1.0 + np.random.exponential(0.5)  # overdue
            elif u < late_p + 0.03:
                ivl *= 0.6 + 0.4 * np.random.random()  # reviewed early
            due[c] = day + max(1, int(round(ivl)))
            last_day[c] = day
        day += 1
    return ev_card[:n], ev_day[:n], ev_sec[:n], ev_rating[:n], ev_state[:n]


def simulate_user(n_reviews: int, seed: int = 0, realistic: bool = False,
                  retention: tuple[float, float] | None = None) -> pd.DataFrame:
    """One user's revlog with exactly `n_reviews` rows, deterministic for a seed (same machine and numba).

    realistic=True draws users closer to the real collections in data/embedded (used for pretraining the neural
    models' shipped weights): the default users study every day at 85-95 % retention, so their intervals stay short
    (median 3-4 days), about 10 % of their interval reviews fail and a card gets 7-10 reviews in 20k. Real users skip
    days (the two substantial embedded users studied on 13 % and 88 % of the days of their span), keep higher
    retention (2-4 % of interval reviews fail), and many press Easy (one embedded user: 62 % of first ratings). So
    here: a session on a given day with probability p_active in [0.15, 0.95] (due cards wait, overdue, for the next
    one), retention in [0.9, 0.97], 4-40 new cards per study day, and rating mixes with a wider spread and more Easy.
    `retention` = (lo, hi) replaces the range the scheduler's desired retention is drawn from (the same draw, so
    the other parameters of a seed do not change), e.g. (0.6, 0.95) for users who fail more often.
    """
    rng = np.random.default_rng(seed)
    w_true = draw_parameters(rng)
    if realistic:
        w_true[:4] *= np.exp(rng.uniform(0.3, 1.2))  # memory stronger than the scheduler's default parameters
        w_true[8] += rng.uniform(0.4, 0.9)
        retention = float(rng.uniform(*(retention or (0.86, 0.95))))
        new_per_day = int(rng.integers(3, 21))
        first_p = rng.dirichlet(np.array([12.0, 5.0, 50.0, 33.0]) * 0.3)
        pass_p = rng.dirichlet(np.array([8.0, 70.0, 22.0]) * 0.3)
        late_p = float(rng.uniform(0.05, 0.3))
        p_active = float(rng.uniform(0.15, 0.95))
    else:
        retention = float(rng.uniform(*(retention or (0.85, 0.95))))
        new_per_day = int(rng.integers(8, 31))
        first_p = rng.dirichlet(np.array([20.0, 8.0, 60.0, 12.0]) * 4)
        pass_p = rng.dirichlet(np.array([7.0, 85.0, 6.0]) * 6)
        late_p = float(rng.uniform(0.1, 0.3))
        p_active = 1.0
    same_day_fail = float(rng.uniform(0.08, 0.2))
    card, day, sec, rating, state = _simulate(int(n_reviews), int(rng.integers(0, 2**31 - 1)), w_true, DEFAULT_W,
                                              retention, new_per_day, first_p, pass_p, late_p, same_day_fail,
                                              p_active)
    order = np.lexsort((card, sec))  # time order; equal seconds broken by card id
    card, day, sec, rating, state = card[order], day[order], sec[order], rating[order], state[order]
    card, day, sec, rating, state = card[:n_reviews], day[:n_reviews], sec[:n_reviews], rating[:n_reviews], \
        state[:n_reviews]
    # elapsed since the card's previous review (−1 for its first)
    by_card = np.lexsort((np.arange(len(card)), card))
    c_sorted = card[by_card]
    first = np.ones(len(card), dtype=bool)
    first[1:] = c_sorted[1:] != c_sorted[:-1]
    prev_day = np.empty(len(card), dtype=np.int64)
    prev_sec = np.empty(len(card), dtype=np.int64)
    prev_day[by_card[1:]] = day[by_card[:-1]]
    prev_sec[by_card[1:]] = sec[by_card[:-1]]
    is_first = np.empty(len(card), dtype=bool)
    is_first[by_card] = first
    elapsed_days = np.where(is_first, -1, day - np.where(is_first, 0, prev_day))
    elapsed_seconds = np.where(is_first, -1, sec - np.where(is_first, 0, prev_sec))
    duration = np.clip(np.exp(rng.normal(np.log(6000), 0.7, len(card))), 500, 60000).astype(np.int64)
    # ids look like Anki's (creation timestamps in ms), unique per card
    card_id = 1_500_000_000_000 + card * 1000 + (seed % 997)
    return pd.DataFrame({
        "card_id": card_id.astype(np.int64),
        "day_offset": day.astype(np.int64),
        "rating": rating.astype(np.int64),
        "state": state.astype(np.int64),
        "duration": duration,
        "elapsed_days": elapsed_days.astype(np.int64),
        "elapsed_seconds": elapsed_seconds.astype(np.int64),
    })


def write_users(out: Path, n_reviews: int, n_users: int, seed: int = 0, first_id: int = 1,
                realistic: bool = False, retention: tuple[float, float] | None = None) -> list[Path]:
    paths = []
    for k in range(n_users):
        uid = first_id + k
        df = simulate_user(n_reviews, seed + k, realistic, retention)
        folder = Path(out) / "revlogs" / f"user_id={uid}"
        folder.mkdir(parents=True, exist_ok=True)
        df.to_parquet(folder / "data.parquet", index=False)
        paths.append(folder / "data.parquet")
    return paths


def add_user_set_args(ap: argparse.ArgumentParser, users: int, reviews: int) -> None:
    """The benchmark scripts' shared choice of users: a data set's first N users, or N simulated ones."""
    ap.add_argument("--data", type=Path, default=None, help="dataset root (default: simulated users)")
    ap.add_argument("--users", type=int, default=users, help="simulated users (or the first N users of --data)")
    ap.add_argument("--reviews", type=int, default=reviews, help="raw reviews per simulated user")
    ap.add_argument("--seed", type=int, default=100)


def open_user_set(a: argparse.Namespace, tmp: Path) -> tuple[Path, list[int], str]:
    """(root, user ids, description) for add_user_set_args's options; simulated users are written under tmp."""
    from data_loader import list_user_ids

    root = a.data
    if root is None:
        root = Path(tmp)
        write_users(root, a.reviews, a.users, seed=a.seed)
    what = str(root) if a.data else f"{a.users} simulated users x {a.reviews:,} reviews (seed {a.seed})"
    return root, list_user_ids(root)[:a.users], what


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Write simulated users in the anki-revlogs-10k layout.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="dataset root; writes OUT/revlogs/user_id=N/data.parquet")
    p.add_argument("--reviews", type=int, default=100_000, help="reviews per user")
    p.add_argument("--users", type=int, default=1, help="number of users (ids first-id, first-id+1, ...)")
    p.add_argument("--first-id", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="user k uses seed + k")
    p.add_argument("--realistic", action="store_true",
                   help="users closer to real collections (days off, higher retention, more Easy; simulate_user)")
    p.add_argument("--retention", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                   help="draw each user's desired retention from [LO, HI] (default: 0.85-0.95; --realistic 0.86-0.95)")
    a = p.parse_args(argv)
    for path in write_users(a.out, a.reviews, a.users, a.seed, a.first_id, a.realistic, a.retention):
        print(path)


if __name__ == "__main__":
    main()
