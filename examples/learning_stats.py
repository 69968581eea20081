"""The statistics the learning studies report, in the standard library alone (the
studies' runs happen in SGLang's venv; their tables are made anywhere).

- take-off: the first step whose sampled reward, averaged over the last ``window``
  steps, reaches a threshold (censored at the run's last step);
- between two arms: each arm's share that took off with its exact (Clopper-Pearson)
  interval, Kaplan-Meier medians of the take-off step, the log-rank test, and the
  smallest differences the design could detect (a share, a hazard ratio);
- at fixed weights: the two-sample chi-squared test of two samplers' answers, the
  per-sample mean of log pi(y_t) + H_t with its standard error, and the intra-group
  correlation of rewards (one-way ICC) with a bootstrap interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

Z = statistics.NormalDist()


# -- take-off --------------------------------------------------------------------------------

TAKE_OFF_WINDOW = 5  # steps the sampled reward is smoothed over
TAKE_OFF_REWARD = 0.5  # the smoothed sampled reward a run takes off at


def trailing_mean(rewards: Sequence[float], window: int = TAKE_OFF_WINDOW) -> list[float]:
    """Each step's mean over the *window* steps up to it (fewer at the start)."""
    return [statistics.fmean(rewards[max(0, step - window):step])
            for step in range(1, len(rewards) + 1)]


def take_off(rewards: Sequence[float], threshold: float = TAKE_OFF_REWARD,
             window: int = TAKE_OFF_WINDOW) -> int | None:
    """The first step (1-based) whose trailing mean over *window* steps (fewer at the
    start) reaches *threshold*; None if no step does (censored)."""
    for step, mean in enumerate(trailing_mean(rewards, window), start=1):
        if mean >= threshold:
            return step
    return None


# -- two arms: shares, survival, power -------------------------------------------------------

def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The exact two-sided 1 - *alpha* interval for a share of *k* in *n*."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError("clopper_pearson needs 0 <= k <= n and n > 0")

    def bisect(rising: Callable[[float], float], target: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if rising(mid) < target else (lo, mid)
        return (lo + hi) / 2

    # lower: P(X >= k) = alpha/2, rising in p; upper: P(X <= k) = alpha/2, falling in p
    lower = 0.0 if k == 0 else bisect(lambda p: 1 - binomial_cdf(k - 1, n, p), alpha / 2)
    upper = 1.0 if k == n else bisect(lambda p: -binomial_cdf(k, n, p), -alpha / 2)
    return lower, upper


def kaplan_meier(times: Sequence[float | None], horizon: float
                 ) -> list[tuple[float, float]]:
    """The survival curve of "not yet taken off": (step, share still below) at each
    step where a run took off; a None is a run censored at *horizon*."""
    events = Counter(t for t in times if t is not None)
    at_risk, surviving, curve = len(times), 1.0, []
    for step in sorted(events):
        if step > horizon:
            break
        surviving *= 1 - events[step] / at_risk
        curve.append((step, surviving))
        at_risk -= events[step]
    return curve


def km_median(times: Sequence[float | None], horizon: float) -> float | None:
    """The Kaplan-Meier median take-off step; None where half never took off."""
    for step, surviving in kaplan_meier(times, horizon):
        if surviving <= 0.5:
            return step
    return None


def logrank(a: Sequence[int | None], b: Sequence[int | None], horizon: int
            ) -> tuple[float, float]:
    """The log-rank test of two arms' take-off steps (None: censored at *horizon*):
    (chi-squared with one degree of freedom, its p-value)."""
    def at(times: Sequence[int | None], step: int) -> tuple[int, int]:
        risk = sum(1 for t in times if t is None or t >= step)
        return risk, sum(1 for t in times if t == step)

    steps = sorted({t for t in [*a, *b] if t is not None and t <= horizon})
    observed_minus_expected, variance = 0.0, 0.0
    for step in steps:
        (na, da), (nb, db) = at(a, step), at(b, step)
        n, d = na + nb, da + db
        if n < 2:
            continue
        observed_minus_expected += da - d * na / n
        variance += d * (na / n) * (nb / n) * (n - d) / (n - 1)
    if variance == 0.0:
        return 0.0, 1.0
    chi2 = observed_minus_expected**2 / variance
    return chi2, math.erfc(math.sqrt(chi2 / 2))


def detectable_share_difference(n_a: int, n_b: int, base: float, alpha: float = 0.05,
                                power: float = 0.8) -> float:
    """The smallest difference from a share of *base* (in arm a) that two arms of *n_a*
    and *n_b* runs detect with *power* at two-sided *alpha* (normal approximation,
    found by bisection); 1.0 where no share in [0, 1] is far enough."""
    za, zb = Z.inv_cdf(1 - alpha / 2), Z.inv_cdf(power)

    def detected(delta: float) -> bool:
        others = [p for p in (base + delta, base - delta) if 0.0 <= p <= 1.0]
        for other in others:
            pooled = (base * n_a + other * n_b) / (n_a + n_b)
            se0 = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
            se1 = math.sqrt(base * (1 - base) / n_a + other * (1 - other) / n_b)
            if se1 > 0 and (delta - za * se0) / se1 >= zb:
                return True
        return False

    widest = max(base, 1.0 - base)
    if not detected(widest):
        return 1.0
    lo, hi = 0.0, widest
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if detected(mid) else (mid, hi)
    return hi


def detectable_hazard_ratio(events: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest hazard ratio (above 1) the log-rank test detects with *power* at
    two-sided *alpha* with *events* take-offs over two equal arms (Schoenfeld);
    infinity without events."""
    if events <= 0:
        return math.inf
    za, zb = Z.inv_cdf(1 - alpha / 2), Z.inv_cdf(power)
    return math.exp(2 * (za + zb) / math.sqrt(events))


# -- samplers at fixed weights ---------------------------------------------------------------

def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X chi-squared with *df* degrees of freedom (the regularized upper
    incomplete gamma function: its series below the mean, a continued fraction above)."""
    if df <= 0:
        raise ValueError("df must be positive")
    if x <= 0:
        return 1.0
    a, z = df / 2, x / 2
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:  # the series of the lower function
        term = total = 1.0 / a
        k = a
        for _ in range(10_000):
            k += 1
            term *= z / k
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Lentz's continued fraction of the upper function
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(log_front)


@dataclass(frozen=True)
class ChiSquared:
    statistic: float
    df: int
    p_value: float
    categories: list[str]


def chi2_two_sample(a: Sequence[Hashable], b: Sequence[Hashable], min_expected: float = 5.0
                    ) -> ChiSquared:
    """Do two samples of answers come from one distribution? Answers expected fewer than
    *min_expected* times in either sample are pooled into one category."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    if not na or not nb:
        raise ValueError("chi2_two_sample needs two non-empty samples")
    kept, other = [], (0, 0)
    for answer in sorted(set(ca) | set(cb), key=repr):
        total = ca[answer] + cb[answer]
        if min(total * na, total * nb) / (na + nb) >= min_expected:
            kept.append((repr(answer), ca[answer], cb[answer]))
        else:
            other = (other[0] + ca[answer], other[1] + cb[answer])
    if sum(other):
        kept.append(("other", *other))
    statistic = 0.0
    for _, xa, xb in kept:
        total = xa + xb
        for x, n in ((xa, na), (xb, nb)):
            expected = total * n / (na + nb)
            statistic += (x - expected) ** 2 / expected
    df = len(kept) - 1
    return ChiSquared(statistic, df, chi2_sf(statistic, df) if df > 0 else 1.0,
                      [k for k, _, _ in kept])


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of *values* and its standard error."""
    if len(values) < 2:
        raise ValueError("mean_se needs two values or more")
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def icc(groups: Sequence[Sequence[float]]) -> float:
    """The one-way intra-class correlation of the values in equal-sized *groups*:
    (MSB - MSW) / (MSB + (G - 1) MSW); 0 where there is no variance."""
    k, g = len(groups), len(groups[0])
    if k < 2 or g < 2 or any(len(x) != g for x in groups):
        raise ValueError("icc needs two or more groups of one size, two or more each")
    grand = statistics.fmean(v for x in groups for v in x)
    means = [statistics.fmean(x) for x in groups]
    msb = g * sum((m - grand) ** 2 for m in means) / (k - 1)
    msw = sum((v - m) ** 2 for x, m in zip(groups, means, strict=True) for v in x) / (k * (g - 1))
    denominator = msb + (g - 1) * msw
    return 0.0 if denominator == 0 else (msb - msw) / denominator


def icc_interval(groups: Sequence[Sequence[float]], rounds: int = 1000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float]:
    """A percentile bootstrap interval of :func:`icc`, groups resampled whole."""
    rng = random.Random(seed)
    draws = sorted(icc([groups[rng.randrange(len(groups))] for _ in groups])
                   for _ in range(rounds))
    return draws[int(alpha / 2 * rounds)], draws[int((1 - alpha / 2) * rounds) - 1]
