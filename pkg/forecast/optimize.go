package forecast

import (
	"errors"
	"math"
)

// ErrNoModel is returned when the optimiser cannot start: the likelihood is
// unbounded or undefined at the start values, as when the series follows an
// exact pattern (a ramp that starts inside the window: its differences are a
// step an AR fits with no error). Like ErrConstant, its future is best taken
// as its last value (Naive).
var ErrNoModel = errors.New("forecast: no model fits: the likelihood cannot be evaluated at the start values (the series follows an exact pattern)")

// relTol ends the search once two iterations in a row improve the objective
// by less than this fraction: R's optim (which R's arima uses) stops at the
// first such iteration with the same tolerance, √ε. Without it a likelihood
// that rises forever along a ridge — an MA part drifting to non-invertible on
// an almost constant series — ran all 200 iterations, thousands of filter
// passes for improvements in the sixth digit (found by FuzzFit).
const relTol = 1.49e-8

// minimize finds a local minimum of f by BFGS with central-difference
// gradients and a backtracking line search. The problems here are small (at
// most MaxP+MaxQ+1 parameters) and smooth; a dedicated routine is a fraction
// of the cost of a general-purpose one, which matters at one fit per GPU per
// sampling period.
func minimize(f func([]float64) float64, x0 []float64) ([]float64, error) {
	n := len(x0)
	x := append([]float64(nil), x0...)
	fx := f(x)
	if math.IsInf(fx, 0) || math.IsNaN(fx) {
		return nil, ErrNoModel
	}
	if n == 0 {
		return x, nil
	}
	g := make([]float64, n)
	gradient(f, x, g)
	H := identity(n) // inverse Hessian approximation
	d := make([]float64, n)
	xn := make([]float64, n)
	gn := make([]float64, n)
	s := make([]float64, n)
	yv := make([]float64, n)
	small := 0 // iterations in a row that improved by less than relTol
	for iter := 0; iter < 200; iter++ {
		if norm(g) < 1e-9 {
			break
		}
		for i := range n {
			d[i] = 0
			for j := range n {
				d[i] -= H[i*n+j] * g[j]
			}
		}
		slope := dot(d, g)
		if slope >= 0 { // not a descent direction: restart from steepest descent
			H = identity(n)
			for i := range n {
				d[i] = -g[i]
			}
			slope = dot(d, g)
		}
		step := 1.0
		var fn float64
		for {
			for i := range n {
				xn[i] = x[i] + step*d[i]
			}
			fn = f(xn)
			if fn <= fx+1e-4*step*slope {
				break
			}
			step *= 0.5
			if step < 1e-12 {
				return x, nil // no further progress possible
			}
		}
		gradient(f, xn, gn)
		for i := range n {
			s[i] = xn[i] - x[i]
			yv[i] = gn[i] - g[i]
		}
		improvement := fx - fn
		copy(x, xn)
		copy(g, gn)
		fx = fn
		if improvement < 1e-15*math.Max(1, math.Abs(fx)) && norm(s) < 1e-10 {
			break
		}
		if improvement <= relTol*(math.Abs(fx)+relTol) {
			small++
			if small == 2 {
				break
			}
		} else {
			small = 0
		}
		sy := dot(s, yv)
		if sy <= 1e-16 {
			continue
		}
		// H ← (I − ρ s yᵀ) H (I − ρ y sᵀ) + ρ s sᵀ
		rho := 1 / sy
		hy := make([]float64, n)
		for i := range n {
			for j := range n {
				hy[i] += H[i*n+j] * yv[j]
			}
		}
		yhy := dot(yv, hy)
		for i := range n {
			for j := range n {
				H[i*n+j] += -rho*(hy[i]*s[j]+s[i]*hy[j]) + (rho*rho*yhy+rho)*s[i]*s[j]
			}
		}
	}
	return x, nil
}

func gradient(f func([]float64) float64, x, g []float64) {
	for i := range x {
		h := 1e-6 * math.Max(1, math.Abs(x[i]))
		orig := x[i]
		x[i] = orig + h
		fp := f(x)
		x[i] = orig - h
		fm := f(x)
		x[i] = orig
		g[i] = (fp - fm) / (2 * h)
		if math.IsInf(fp, 0) || math.IsInf(fm, 0) {
			g[i] = 0
		}
	}
}

func identity(n int) []float64 {
	m := make([]float64, n*n)
	for i := range n {
		m[i*n+i] = 1
	}
	return m
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func norm(a []float64) float64 { return math.Sqrt(dot(a, a)) }
