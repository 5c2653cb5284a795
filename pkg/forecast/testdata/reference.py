#!/usr/bin/python3
"""Reference values for pkg/forecast, from statsmodels' ARIMA (state-space MLE,
its defaults). Run with Debian's python3-statsmodels:

    apt-get install python3-statsmodels
    /usr/bin/python3 pkg/forecast/testdata/reference.py > pkg/forecast/testdata/reference.json

The series are generated here with a fixed seed and written into the JSON, so
the Go test needs no Python. Each is a GPU-utilisation-like trace of 600 samples
(5 minutes at 500 ms) in [0, 1]."""
import json
import warnings

import numpy as np
import statsmodels
from statsmodels.tsa.arima.model import ARIMA

N = 600
rng = np.random.default_rng(20261202)
t = np.arange(N)


def clip(x):
    return np.clip(x, 0.0, 1.0)


def ar_noise(phi, scale):
    e = rng.normal(0, scale, N + 100)
    x = np.zeros(N + 100)
    for i in range(2, N + 100):
        x[i] = phi[0] * x[i - 1] + phi[1] * x[i - 2] + e[i]
    return x[100:]


series = {
    # a slow ramp with AR(2) noise
    "trend": clip(0.2 + 0.6 * t / N + ar_noise((0.5, 0.2), 0.02)),
    # stationary noise around a level
    "noise": clip(0.5 + ar_noise((0.3, -0.1), 0.05)),
    # a load step half way
    "step": clip(np.where(t < N // 2, 0.3, 0.8) + ar_noise((0.6, 0.1), 0.02)),
    # two cycles of a daily-like wave compressed into the window
    "diurnal": clip(0.55 + 0.3 * np.sin(2 * np.pi * t / 300) + ar_noise((0.4, 0.0), 0.02)),
    # bursts: short spikes on a low base
    "bursty": clip(0.2 + (rng.random(N) < 0.05) * rng.uniform(0.3, 0.7, N) + ar_noise((0.7, 0.0), 0.02)),
}

out = {"statsmodels": statsmodels.__version__, "cases": []}
for name, y in series.items():
    for order in [(5, 1, 0), (2, 1, 1), (1, 0, 1)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = ARIMA(y, order=order).fit()
        fc = res.get_forecast(10)
        ci = fc.conf_int(alpha=0.05)
        out["cases"].append({
            "name": name,
            "order": list(order),
            "series": [round(float(v), 10) for v in y],
            "params": dict(zip(res.model.param_names, [float(v) for v in res.params])),
            "loglike": float(res.llf),
            "forecast": [float(v) for v in fc.predicted_mean],
            "lower95": [float(v) for v in ci[:, 0]],
            "upper95": [float(v) for v in ci[:, 1]],
        })
json.dump(out, __import__("sys").stdout, indent=1)
