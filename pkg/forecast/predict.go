package forecast

import (
	"fmt"
	"math"
)

// Forecast is an h-step forecast: the mean and the standard error of each step.
type Forecast struct {
	Mean, StdErr []float64
}

// Interval returns the bounds of the central prediction interval with z
// standard errors (1.96 for 95 %).
func (f Forecast) Interval(z float64) (lower, upper []float64) {
	lower = make([]float64, len(f.Mean))
	upper = make([]float64, len(f.Mean))
	for i := range f.Mean {
		lower[i] = f.Mean[i] - z*f.StdErr[i]
		upper[i] = f.Mean[i] + z*f.StdErr[i]
	}
	return lower, upper
}

// Forecast predicts the h points after the fitted series. The d integrations
// are carried in the state, so the intervals account for them exactly:
// the state is (yₜ₋₁ … yₜ₋d, αₜ) and yₜ = Σ cₖ yₜ₋ₖ + Z αₜ with (1 − B)ᵈ = 1 − Σ cₖ Bᵏ.
func (m *Model) Forecast(h int) (Forecast, error) {
	if h < 1 {
		return Forecast{}, fmt.Errorf("forecast: horizon %d must be at least 1", h)
	}
	d := m.Order.D
	r := stateDim(m.AR, m.MA)
	k := d + r
	c := integrationCoefficients(d)
	// State mean and covariance (σ² units) at the first forecast step.
	s := make([]float64, k)
	for i := range d {
		s[i] = m.tail[d-1-i] // yₜ₋₁, yₜ₋₂, …
	}
	copy(s[d:], m.a)
	P := make([]float64, k*k)
	for i := range r {
		for j := range r {
			P[(d+i)*k+d+j] = m.p[i*r+j]
		}
	}
	Z := make([]float64, k)
	copy(Z, c)
	Z[d] = 1
	T := make([]float64, k*k)
	// new yₜ (becomes the first lag) = Z s; lags shift down.
	copy(T[:k], Z)
	for i := 1; i < d; i++ {
		T[i*k+i-1] = 1
	}
	A := companion(m.AR, r)
	for i := range r {
		for j := range r {
			T[(d+i)*k+d+j] = A[i*r+j]
		}
	}
	R := make([]float64, k)
	R[d] = 1
	copy(R[d+1:], m.MA)
	// The error at step i is g_i·(s₁ − E s₁) + Σⱼ<ᵢ (g_j·R) εⱼ₊₁ with
	// g_i = Z Tⁱ⁻¹, so Var_i = g_i P g_iᵀ + Σⱼ<ᵢ (g_j·R)²: O(k²) a step
	// instead of propagating the covariance, O(k³).
	out := Forecast{Mean: make([]float64, h), StdErr: make([]float64, h)}
	g := append([]float64(nil), Z...)
	gn := make([]float64, k)
	ns := make([]float64, k)
	var noise float64 // Σⱼ<ᵢ (g_j·R)²
	for step := range h {
		out.Mean[step] = m.Mean + dot(Z, s)
		var v float64
		for i := range k {
			var pi float64
			for j := range k {
				pi += P[i*k+j] * g[j]
			}
			v += g[i] * pi
		}
		out.StdErr[step] = math.Sqrt(math.Max(v+noise, 0) * m.Sigma2)
		gr := dot(g, R)
		noise += gr * gr
		for j := range k {
			var t float64
			for i := range k {
				t += g[i] * T[i*k+j]
			}
			gn[j] = t
		}
		g, gn = gn, g
		for i := range k {
			ns[i] = dot(T[i*k:(i+1)*k], s)
		}
		copy(s, ns)
	}
	return out, nil
}

// integrationCoefficients returns c₁…c_d with (1 − B)ᵈ = 1 − Σ cₖ Bᵏ.
func integrationCoefficients(d int) []float64 {
	switch d {
	case 1:
		return []float64{1}
	case 2:
		return []float64{2, -1}
	}
	return nil
}

// Naive is the fallback forecast for a series no model fits (ErrConstant,
// ErrNoModel):
// its last value, with zero-width intervals.
func Naive(y []float64, h int) Forecast {
	f := Forecast{Mean: make([]float64, h), StdErr: make([]float64, h)}
	if len(y) == 0 {
		return f
	}
	for i := range f.Mean {
		f.Mean[i] = y[len(y)-1]
	}
	return f
}
