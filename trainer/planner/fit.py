"""Small fits from measured points: non-negative least squares (time is a sum of non-negative costs)
and piecewise-linear interpolation. numpy only."""
from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set). Columns are scaled to unit norm
    first so that features of very different sizes (1, tokens, rows*len*len) fit alike."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    w = a.T @ (b - a @ x)
    for _ in range(iterations):
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
        w = a.T @ (b - a @ x)
    return x / scale


def linear(points, features) -> np.ndarray:
    """Coefficients c >= 0 with y ~ sum_i c_i f_i(point); `points` rows end with y, `features(row)`
    gives the feature vector of a row."""
    rows = [list(p) for p in points]
    if not rows:
        raise ValueError("no measured points")
    a = np.array([features(r[:-1]) for r in rows], float)
    return nnls(a, np.array([r[-1] for r in rows], float))


class Curve:
    """y(x) through measured (x, y) points: linear between them, the end segments extended (never
    below the first point's y when extrapolating down, never negative)."""

    def __init__(self, xs, ys):
        order = np.argsort(xs)
        self.x, self.y = np.asarray(xs, float)[order], np.asarray(ys, float)[order]
        if len(self.x) == 0:
            raise ValueError("no measured points")

    def __call__(self, x: float) -> float:
        xs, ys = self.x, self.y
        if len(xs) == 1 or x <= xs[0]:
            return float(ys[0])
        if x >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if xs[-1] > xs[-2] else 0.0
            return float(max(0.0, ys[-1] + slope * (x - xs[-1])))
        return float(np.interp(x, xs, ys))
