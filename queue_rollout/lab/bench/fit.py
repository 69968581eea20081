"""Fitting a profile's free parameters to a baseline's figures.

A damped Newton iteration in log space: each round measures the figures at the current
parameters and at each parameter nudged by ``step`` (a finite-difference Jacobian),
then moves every parameter by the least-squares solution, each move clipped to
``max_move`` (in log units), halved (twice at most) while it makes the worst figure
worse. The model is a discrete-event simulation, so the figures
are piecewise smooth at best: the iteration stops when every figure is within
``tolerance`` of its target or after ``rounds`` rounds, and returns the best point seen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass
class Fit:
    params: dict[str, float]
    figures: dict[str, float]
    targets: dict[str, float]
    evaluations: int = 0
    history: list[tuple[dict[str, float], dict[str, float]]] = field(default_factory=list)

    @property
    def worst_error(self) -> float:
        """The largest relative distance of a figure from its target."""
        return max(abs(self.figures[k] / v - 1) for k, v in self.targets.items())


def least_squares(a: list[list[float]], b: list[float]) -> list[float]:
    """Least squares: the x minimising |a x - b| (normal equations, with a small ridge
    so that a parameter no figure responds to stays where it is)."""
    n = len(a[0])
    ata = [[sum(row[i] * row[j] for row in a) + (1e-6 if i == j else 0.0) for j in range(n)]
           for i in range(n)]
    atb = [sum(row[i] * bi for row, bi in zip(a, b, strict=True)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda r: abs(ata[r][col]))
        ata[col], ata[pivot] = ata[pivot], ata[col]
        atb[col], atb[pivot] = atb[pivot], atb[col]
        for r in range(n):
            if r != col and ata[col][col]:
                f = ata[r][col] / ata[col][col]
                ata[r] = [x - f * y for x, y in zip(ata[r], ata[col], strict=True)]
                atb[r] -= f * atb[col]
    return [atb[i] / ata[i][i] if ata[i][i] else 0.0 for i in range(n)]


def fit(evaluate: Callable[[Mapping[str, float]], dict[str, float]],
        start: Mapping[str, float], targets: Mapping[str, float], *, rounds: int = 6,
        step: float = 0.15, max_move: float = 0.5, tolerance: float = 0.03,
        progress: Callable[[str], None] = lambda line: None) -> Fit:
    """Parameters (all positive) near *start* whose figures meet *targets* (all
    positive); *evaluate* maps parameters to figures (a superset of the targets)."""
    names, goals = list(start), dict(targets)
    result = Fit(dict(start), {}, goals)

    def measure(params: dict[str, float]) -> dict[str, float]:
        figures = evaluate(params)
        result.evaluations += 1
        result.history.append((dict(params), dict(figures)))
        return figures

    def error(figures: Mapping[str, float]) -> float:
        return max(abs(figures[k] / v - 1) for k, v in goals.items())

    params = dict(start)
    figures = measure(params)
    best = (error(figures), params, figures)
    for r in range(rounds):
        progress(f"fit round {r + 1}: worst error {error(figures):.1%} at "
                 + ", ".join(f"{k}={v:.4g}" for k, v in params.items()))
        if error(figures) <= tolerance:
            break
        columns = []
        for name in names:
            nudged = {**params, name: params[name] * math.exp(step)}
            moved = measure(nudged)
            columns.append([(math.log(moved[k]) - math.log(figures[k])) / step for k in goals])
        jacobian = [[columns[j][i] for j in range(len(names))] for i in range(len(goals))]
        residual = [math.log(v) - math.log(figures[k]) for k, v in goals.items()]
        move = least_squares(jacobian, residual)
        for damping in (1.0, 0.5, 0.25):  # backtrack while the move makes things worse
            trial = {name: params[name] * math.exp(
                         max(-max_move, min(max_move, d)) * damping)
                     for name, d in zip(names, move, strict=True)}
            trial_figures = measure(trial)
            if error(trial_figures) < error(figures):
                break
        params, figures = trial, trial_figures
        if error(figures) < best[0]:
            best = (error(figures), params, figures)
    result.params, result.figures = dict(best[1]), dict(best[2])
    return result
