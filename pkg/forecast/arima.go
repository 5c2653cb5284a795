// Package forecast fits ARIMA(p,d,q) models to utilization series and
// forecasts them with prediction intervals. It is pure numerics: no I/O, no
// clock, no randomness; the same series gives the same model.
//
// Estimation is exact Gaussian maximum likelihood, the likelihood evaluated by a
// Kalman filter on the d-times differenced series (with the stationary initial
// state). Exact MLE rather than conditional sum of squares, because the
// forecaster must agree with the reference implementation operators already
// trust (statsmodels' ARIMA, state-space MLE): CSS drops the first p terms of
// the likelihood and its estimates drift from the exact ones on the short
// windows (hundreds of points) the adjuster fits. The differenced series with a
// stationary start is what statsmodels' diffuse initialisation of the
// integrated states amounts to, so the likelihoods are the same function.
//
// Stationarity and invertibility are enforced by estimating partial
// autocorrelations (Jones' transformation, as statsmodels does), so a fitted
// model is always stationary and invertible.
package forecast

import (
	"errors"
	"fmt"
	"math"
)

// Limits of the orders this package fits.
const (
	MaxP = 8
	MaxD = 2
	MaxQ = 2
)

// Errors callers branch on.
var (
	// ErrOrder: the order is outside what the package fits.
	ErrOrder = errors.New("forecast: unsupported order")
	// ErrTooShort: too few points for the order.
	ErrTooShort = errors.New("forecast: series too short")
	// ErrNotFinite: the series holds NaN or ±Inf.
	ErrNotFinite = errors.New("forecast: series has a NaN or infinite value")
	// ErrConstant: after differencing the series does not vary, so no
	// stochastic model exists. Its future is its last value (see Naive).
	ErrConstant = errors.New("forecast: series is constant after differencing")
	// ErrNonStationary: given AR coefficients have a root on or inside the unit
	// circle (or MA coefficients are not invertible).
	ErrNonStationary = errors.New("forecast: coefficients not stationary or not invertible")
)

// Order is an ARIMA order.
type Order struct{ P, D, Q int }

func (o Order) String() string { return fmt.Sprintf("ARIMA(%d,%d,%d)", o.P, o.D, o.Q) }

func (o Order) check() error {
	if o.P < 0 || o.P > MaxP || o.D < 0 || o.D > MaxD || o.Q < 0 || o.Q > MaxQ {
		return fmt.Errorf("%w: %s (want p ≤ %d, d ≤ %d, q ≤ %d)", ErrOrder, o, MaxP, MaxD, MaxQ)
	}
	return nil
}

// minPoints is the shortest series Fit accepts for o: enough differenced
// points to estimate every parameter several times over.
func (o Order) minPoints() int { return o.D + 3*(o.P+o.Q+1) + 10 }

// Model is a fitted ARIMA model, ready to forecast the series it was fitted on.
type Model struct {
	Order Order
	// AR holds φ₁…φp and MA θ₁…θq in the sign convention of statsmodels:
	// (1 − Σφᵢ Bⁱ)(1 − B)ᵈ yₜ = (1 + Σθⱼ Bʲ) εₜ.
	AR, MA []float64
	// Mean is the process mean (d = 0 only; differenced models have none).
	Mean float64
	// Sigma2 is the innovation variance, LogLik the maximised log-likelihood.
	Sigma2, LogLik float64
	// N is the number of points fitted.
	N int

	// tail holds the last d points of the series (levels needed to integrate).
	tail []float64
	// a, p are the ARMA state's prediction for the step after the series and
	// its covariance (in units of Sigma2).
	a []float64
	p []float64
}

// Fit estimates an ARIMA model of the given order on y by exact maximum likelihood.
func Fit(y []float64, o Order) (*Model, error) {
	m, _, err := fit(y, o)
	return m, err
}

// fit is Fit, and also says how many times it evaluated the likelihood: the
// cost of a fit, which tests bound.
func fit(y []float64, o Order) (*Model, int, error) {
	if err := o.check(); err != nil {
		return nil, 0, err
	}
	if len(y) < o.minPoints() {
		return nil, 0, fmt.Errorf("%w: %d points for %s, need at least %d", ErrTooShort, len(y), o, o.minPoints())
	}
	for i, v := range y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, 0, fmt.Errorf("%w (point %d)", ErrNotFinite, i)
		}
	}
	w := difference(y, o.D)
	mean, variance := meanVar(w)
	if variance <= 1e-300 || variance <= 1e-24*(mean*mean) {
		return nil, 0, ErrConstant
	}
	// Work on a standardised copy: the optimiser's steps and tolerances then
	// mean the same whatever the series' units.
	scale := math.Sqrt(variance)
	z := make([]float64, len(w))
	for i := range w {
		z[i] = w[i] / scale
	}
	withMean := o.D == 0
	x0 := startValues(z, o, withMean, mean/scale)
	obj := objective{z: z, o: o, withMean: withMean}
	x, err := minimize(obj.eval, x0)
	if err != nil {
		return nil, obj.evals, err
	}
	phi, theta, mu := obj.params(x)
	m := &Model{Order: o, AR: phi, MA: theta, N: len(y)}
	if withMean {
		m.Mean = mu * scale
	}
	centred := make([]float64, len(w))
	for i := range w {
		centred[i] = w[i] - m.Mean
	}
	if err := m.condition(y, centred); err != nil {
		return nil, obj.evals, err
	}
	return m, obj.evals, nil
}

// condition runs the filter over the centred differenced series w of y with
// m's coefficients and fills in σ², the likelihood and the forecast origin.
func (m *Model) condition(y, w []float64) error {
	k := filter(w, m.AR, m.MA, true)
	n := float64(len(w))
	if k.degenerate || k.ss <= 0 {
		return ErrConstant
	}
	m.Sigma2 = k.ss / n
	m.LogLik = -0.5 * (n*(math.Log(2*math.Pi*m.Sigma2)+1) + k.sumLogF)
	m.a, m.p = k.a, k.p
	m.tail = append([]float64(nil), y[len(y)-m.Order.D:]...)
	return nil
}

// difference applies (1 − B)ᵈ.
func difference(y []float64, d int) []float64 {
	w := append([]float64(nil), y...)
	for range d {
		for i := len(w) - 1; i > 0; i-- {
			w[i] -= w[i-1]
		}
		w = w[1:]
	}
	return w
}

func meanVar(w []float64) (float64, float64) {
	var s float64
	for _, v := range w {
		s += v
	}
	mean := s / float64(len(w))
	var ss float64
	for _, v := range w {
		ss += (v - mean) * (v - mean)
	}
	return mean, ss / float64(len(w))
}

// objective is −loglik/n of the standardised differenced series as a
// function of unconstrained parameters.
type objective struct {
	z        []float64
	o        Order
	withMean bool
	buf      []float64
	ar       *arStats // pure AR models only
	evals    int      // times eval ran
}

// params maps unconstrained parameters to (φ, θ, μ).
func (f *objective) params(x []float64) ([]float64, []float64, float64) {
	phi := constrainStationary(x[:f.o.P])
	ma := constrainStationary(x[f.o.P : f.o.P+f.o.Q])
	// θ(B) = 1 + Σθⱼ Bʲ is invertible iff φ = −θ is a stationary AR.
	for i := range ma {
		ma[i] = -ma[i]
	}
	var mu float64
	if f.withMean {
		mu = x[f.o.P+f.o.Q]
	}
	return phi, ma, mu
}

func (f *objective) eval(x []float64) float64 {
	f.evals++
	phi, theta, mu := f.params(x)
	if len(theta) == 0 {
		if f.ar == nil {
			f.ar = newARStats(f.z, f.o.P)
		}
		ss, sumLogF, ok := f.ar.likelihood(phi, mu)
		if !ok || ss <= 0 {
			return math.Inf(1)
		}
		n := float64(len(f.z))
		return 0.5 * (math.Log(2*math.Pi*ss/n) + 1 + sumLogF/n)
	}
	w := f.z
	if f.withMean {
		if f.buf == nil {
			f.buf = make([]float64, len(f.z))
		}
		for i, v := range f.z {
			f.buf[i] = v - mu
		}
		w = f.buf
	}
	k := filter(w, phi, theta, false)
	if k.degenerate {
		return math.Inf(1)
	}
	ss, sumLogF := k.ss, k.sumLogF
	n := float64(len(w))
	return 0.5 * (math.Log(2*math.Pi*ss/n) + 1 + sumLogF/n)
}

// startValues: AR coefficients by least squares on lagged values (and, with
// MA terms, on the residuals of a long autoregression: Hannan–Rissanen), then
// mapped to the unconstrained space, shrunk towards zero if not stationary.
func startValues(z []float64, o Order, withMean bool, mean float64) []float64 {
	x := make([]float64, 0, o.P+o.Q+1)
	c := make([]float64, len(z))
	for i, v := range z {
		c[i] = v
		if withMean {
			c[i] -= mean
		}
	}
	var resid []float64
	if o.Q > 0 {
		long := min(max(o.P+o.Q+4, 10), len(c)/4)
		coef := leastSquaresAR(c, long, long, nil, 0)
		resid = make([]float64, len(c))
		for t := long; t < len(c); t++ {
			r := c[t]
			for i, f := range coef {
				r -= f * c[t-1-i]
			}
			resid[t] = r
		}
	}
	start := o.P
	if o.Q > 0 {
		start = max(o.P, min(max(o.P+o.Q+4, 10), len(c)/4)+o.Q)
	}
	coef := leastSquaresAR(c, start, o.P, resid, o.Q)
	phi, theta := coef[:o.P], coef[o.P:]
	for i := range theta {
		theta[i] = -theta[i]
	}
	x = append(x, unconstrainStationary(phi)...)
	x = append(x, unconstrainStationary(theta)...)
	for i := range theta {
		theta[i] = -theta[i]
	}
	if withMean {
		x = append(x, mean)
	}
	return x
}

// leastSquaresAR regresses c[t], t ≥ start, on p of its lags and q lags of resid.
func leastSquaresAR(c []float64, start, p int, resid []float64, q int) []float64 {
	k := p + q
	if k == 0 {
		return nil
	}
	xtx := make([]float64, k*k)
	xty := make([]float64, k)
	row := make([]float64, k)
	for t := start; t < len(c); t++ {
		for i := range p {
			row[i] = c[t-1-i]
		}
		for j := range q {
			row[p+j] = resid[t-1-j]
		}
		for i := range k {
			xty[i] += row[i] * c[t]
			for j := range k {
				xtx[i*k+j] += row[i] * row[j]
			}
		}
	}
	for i := range k {
		xtx[i*k+i] *= 1 + 1e-8 // ridge against exact collinearity
	}
	coef, ok := solve(xtx, xty, k)
	if !ok {
		return make([]float64, k)
	}
	return coef
}

// NewModel builds a model with given coefficients on the series y (σ² and the
// likelihood estimated from y), for example to evaluate another
// implementation's estimates. AR must be stationary and MA invertible.
func NewModel(y []float64, o Order, ar, ma []float64, mean float64) (*Model, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if len(ar) != o.P || len(ma) != o.Q {
		return nil, fmt.Errorf("%w: %d AR and %d MA coefficients for %s", ErrOrder, len(ar), len(ma), o)
	}
	if len(y) <= o.D {
		return nil, fmt.Errorf("%w: %d points for %s", ErrTooShort, len(y), o)
	}
	for i, v := range y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w (point %d)", ErrNotFinite, i)
		}
	}
	neg := make([]float64, len(ma))
	for i := range ma {
		neg[i] = -ma[i]
	}
	if !stationary(ar) || !stationary(neg) {
		return nil, fmt.Errorf("%w: AR %v, MA %v", ErrNonStationary, ar, ma)
	}
	if o.D > 0 {
		mean = 0
	}
	w := difference(y, o.D)
	for i := range w {
		w[i] -= mean
	}
	m := &Model{Order: o, AR: append([]float64(nil), ar...), MA: append([]float64(nil), ma...), Mean: mean, N: len(y)}
	if err := m.condition(y, w); err != nil {
		return nil, err
	}
	return m, nil
}

// stationary reports whether 1 − Σφᵢ zⁱ has all its roots outside the unit
// circle: every partial autocorrelation of the reverse Durbin–Levinson
// recursion is inside (−1, 1).
func stationary(phi []float64) bool {
	cur := append([]float64(nil), phi...)
	for k := len(cur) - 1; k >= 0; k-- {
		r := cur[k]
		if math.IsNaN(r) || math.Abs(r) >= 1 {
			return false
		}
		prev := make([]float64, k)
		for i := range k {
			prev[i] = (cur[i] + r*cur[k-1-i]) / (1 - r*r)
		}
		cur = prev
	}
	return true
}
