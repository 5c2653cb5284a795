package forecast

import "math"

// The ARMA(p,q) state space (Harvey's form) with r = max(p, q+1):
//
//	wₜ = Z αₜ,  αₜ₊₁ = T αₜ + R εₜ₊₁,  Z = (1 0 … 0), R = (1 θ₁ … θᵣ₋₁)ᵀ,
//
// T the companion matrix with φ in its first column and ones above the
// diagonal. Covariances are in units of σ², so σ² can be profiled out.

// kalmanResult is what one filter pass yields.
type kalmanResult struct {
	ss, sumLogF float64 // Σ vₜ²/Fₜ and Σ log Fₜ
	degenerate  bool    // some Fₜ ≤ 0
	a, p        []float64
}

// steadyTol: once the predicted covariance stops changing by more than this,
// gain and Fₜ are frozen. statsmodels freezes too; the difference this makes
// to the likelihood is below 1e-12.
const steadyTol = 1e-13

func stateDim(phi, theta []float64) int { return max(len(phi), len(theta)+1) }

// filter runs the Kalman filter over w (zero mean). With keep, it returns the
// one-step prediction of the state after the last point and its covariance.
func filter(w []float64, phi, theta []float64, keep bool) kalmanResult {
	r := stateDim(phi, theta)
	T := companion(phi, r)
	R := make([]float64, r)
	R[0] = 1
	copy(R[1:], theta)
	P := lyapunov(T, R, r)
	a := make([]float64, r)
	k := make([]float64, r) // P Z' / F
	tmp := make([]float64, r*r)
	next := make([]float64, r*r)
	scratch := make([]float64, r*r)
	var res kalmanResult
	steady := false
	var F float64
	for _, wt := range w {
		if !steady {
			F = P[0]
		}
		if F <= 0 || math.IsNaN(F) {
			res.degenerate = true
			return res
		}
		v := wt - a[0]
		res.ss += v * v / F
		res.sumLogF += math.Log(F)
		if !steady {
			for i := range r {
				k[i] = P[i*r] / F
			}
		}
		// aₜ|ₜ = aₜ + k v, then aₜ₊₁ = T aₜ|ₜ (companion: O(r)).
		for i := range r {
			a[i] += k[i] * v
		}
		mulCompanion(a, phi, r)
		if steady {
			continue
		}
		// Pₜ|ₜ = P − k F kᵀ; Pₜ₊₁ = T Pₜ|ₜ Tᵀ + R Rᵀ.
		for i := range r {
			for j := range r {
				tmp[i*r+j] = P[i*r+j] - k[i]*F*k[j]
			}
		}
		sandwichCompanion(phi, tmp, next, scratch, r)
		change := 0.0
		for i := range r {
			for j := range r {
				nv := next[i*r+j] + R[i]*R[j]
				if d := nv - P[i*r+j]; d > change {
					change = d
				} else if -d > change {
					change = -d
				}
				P[i*r+j] = nv
			}
		}
		if change < steadyTol {
			steady = true
			F = P[0]
			for i := range r {
				k[i] = P[i*r] / F
			}
		}
	}
	if keep {
		res.a = a
		res.p = P
	}
	return res
}

func companion(phi []float64, r int) []float64 {
	T := make([]float64, r*r)
	for i := range r {
		if i < len(phi) {
			T[i*r] = phi[i]
		}
		if i+1 < r {
			T[i*r+i+1] = 1
		}
	}
	return T
}

// mulCompanion sets a = T a for the companion matrix of phi.
func mulCompanion(a, phi []float64, r int) {
	a0 := a[0]
	for i := range r {
		var v float64
		if i < len(phi) {
			v = phi[i] * a0
		}
		if i+1 < r {
			v += a[i+1]
		}
		a[i] = v
	}
}

// sandwichCompanion sets out = T M Tᵀ for the companion matrix T of phi in
// O(r²): row i of T is φᵢ e₀ᵀ + eᵢ₊₁ᵀ. The filter does this at every step
// until the covariance settles, and near a non-invertible MA it does not
// settle, so the dense O(r³) product made one fit of ARIMA(8,0,2) on an
// almost constant series take seconds (found by FuzzFit).
func sandwichCompanion(phi, M, out, tm []float64, r int) {
	// tm = T M: row i is φᵢ·M₀ + Mᵢ₊₁.
	for i := range r {
		var f float64
		if i < len(phi) {
			f = phi[i]
		}
		row := tm[i*r : (i+1)*r]
		for j := range r {
			v := f * M[j]
			if i+1 < r {
				v += M[(i+1)*r+j]
			}
			row[j] = v
		}
	}
	// out = tm Tᵀ: element (i, j) is φⱼ·tm[i][0] + tm[i][j+1].
	for i := range r {
		for j := range r {
			var v float64
			if j < len(phi) {
				v = phi[j] * tm[i*r]
			}
			if j+1 < r {
				v += tm[i*r+j+1]
			}
			out[i*r+j] = v
		}
	}
}

// sandwich sets out = T M Tᵀ (r×r, row-major); tm is r×r scratch.
func sandwich(T, M, out, tm []float64, r int) {
	for i := range r {
		for j := range r {
			var s float64
			for k := range r {
				s += T[i*r+k] * M[k*r+j]
			}
			tm[i*r+j] = s
		}
	}
	for i := range r {
		for j := range r {
			var s float64
			for k := range r {
				s += tm[i*r+k] * T[j*r+k]
			}
			out[i*r+j] = s
		}
	}
}

// lyapunov solves P = T P Tᵀ + R Rᵀ by doubling: P = Σₖ Tᵏ R Rᵀ (Tᵀ)ᵏ.
// T is stationary, so Tᵏ → 0; near a unit root it takes more doublings.
func lyapunov(T, R []float64, r int) []float64 {
	P := make([]float64, r*r)
	for i := range r {
		for j := range r {
			P[i*r+j] = R[i] * R[j]
		}
	}
	A := append([]float64(nil), T...)
	tmp := make([]float64, r*r)
	A2 := make([]float64, r*r)
	scratch := make([]float64, r*r)
	for range 64 {
		sandwich(A, P, tmp, scratch, r)
		for i := range P {
			P[i] += tmp[i]
		}
		// A = A·A
		maxA := 0.0
		for i := range r {
			for j := range r {
				var s float64
				for k := range r {
					s += A[i*r+k] * A[k*r+j]
				}
				A2[i*r+j] = s
				maxA = math.Max(maxA, math.Abs(s))
			}
		}
		A, A2 = A2, A
		if maxA < 1e-17 {
			break
		}
	}
	return P
}

// arLikelihood is the exact likelihood of a zero-mean AR(p) without a Kalman
// filter (see arStats). It equals filter's result.
func arLikelihood(w, phi []float64) (ss, sumLogF float64, ok bool) {
	return newARStats(w, len(phi)).likelihood(phi, 0)
}

// arStats holds the sufficient statistics of an AR(p) likelihood of a series z:
// the first p points, and the lagged cross-products of the rest. With them one
// likelihood evaluation costs O(p³) instead of O(n·p), which is what makes
// fitting ARIMA(p,d,0) fast.
type arStats struct {
	p    int
	head []float64 // z₀…zₚ₋₁
	// cross[i][j] = Σₜ zₜ₋ᵢ zₜ₋ⱼ and sum[i] = Σₜ zₜ₋ᵢ over t = p…n−1; count = n−p.
	cross []float64
	sum   []float64
	count float64
}

func newARStats(z []float64, p int) *arStats {
	st := &arStats{p: p, head: z[:min(p, len(z))], cross: make([]float64, (p+1)*(p+1)), sum: make([]float64, p+1)}
	for t := p; t < len(z); t++ {
		for i := 0; i <= p; i++ {
			st.sum[i] += z[t-i]
			for j := i; j <= p; j++ {
				st.cross[i*(p+1)+j] += z[t-i] * z[t-j]
			}
		}
		st.count++
	}
	for i := 0; i <= p; i++ {
		for j := 0; j < i; j++ {
			st.cross[i*(p+1)+j] = st.cross[j*(p+1)+i]
		}
	}
	return st
}

// likelihood returns Σ vₜ²/Fₜ and Σ log Fₜ of z − μ under AR(φ): the first p
// points under the stationary distribution (Γₚ from the autocovariances), the
// rest conditionally, whose residual sum of squares is a quadratic form in
// (1, −φ) over the cross-products. ok is false if Γₚ is not positive definite
// (φ not stationary).
func (st *arStats) likelihood(phi []float64, mu float64) (ss, sumLogF float64, ok bool) {
	p := st.p
	if p == 0 {
		return st.cross[0] - 2*mu*st.sum[0] + mu*mu*st.count + headSS(st.head, mu), 0, true
	}
	gamma, ok := arAutocov(phi)
	if !ok {
		return 0, 0, false
	}
	// Γₚ = Toeplitz(γ₀…γₚ₋₁); Cholesky; head ᵀ Γₚ⁻¹ head and log|Γₚ|.
	var L [MaxP * MaxP]float64
	for i := range p {
		for j := 0; j <= i; j++ {
			s := gamma[i-j]
			for k := range j {
				s -= L[i*p+k] * L[j*p+k]
			}
			if i == j {
				if s <= 0 {
					return 0, 0, false
				}
				L[i*p+i] = math.Sqrt(s)
				sumLogF += 2 * math.Log(L[i*p+i])
			} else {
				L[i*p+j] = s / L[j*p+j]
			}
		}
	}
	var zs [MaxP]float64
	for i := range len(st.head) {
		s := st.head[i] - mu
		for k := range i {
			s -= L[i*p+k] * zs[k]
		}
		zs[i] = s / L[i*p+i]
		ss += zs[i] * zs[i]
	}
	// Σₜ (Σᵢ aᵢ (zₜ₋ᵢ − μ))² with a = (1, −φ₁, …, −φₚ).
	var a [MaxP + 1]float64
	a[0] = 1
	for i, f := range phi {
		a[i+1] = -f
	}
	n := p + 1
	for i := 0; i <= p; i++ {
		for j := 0; j <= p; j++ {
			ss += a[i] * a[j] * (st.cross[i*n+j] - mu*(st.sum[i]+st.sum[j]) + mu*mu*st.count)
		}
	}
	return ss, sumLogF, true
}

func headSS(head []float64, mu float64) float64 {
	var s float64
	for _, v := range head {
		s += (v - mu) * (v - mu)
	}
	return s
}

// arAutocov returns γ₀…γₚ of an AR(p) with unit innovation variance, from
// γₖ − Σᵢ φᵢ γ|ₖ₋ᵢ| = δₖ₀.
func arAutocov(phi []float64) ([]float64, bool) {
	p := len(phi)
	n := p + 1
	A := make([]float64, n*n)
	b := make([]float64, n)
	b[0] = 1
	for k := range n {
		A[k*n+k] += 1
		for i := 1; i <= p; i++ {
			lag := k - i
			if lag < 0 {
				lag = -lag
			}
			A[k*n+lag] -= phi[i-1]
		}
	}
	return solve(A, b, n)
}

// solve solves A x = b (n×n, row-major) by Gaussian elimination with partial
// pivoting. A and b are overwritten.
func solve(A, b []float64, n int) ([]float64, bool) {
	for c := range n {
		piv := c
		for r := c + 1; r < n; r++ {
			if math.Abs(A[r*n+c]) > math.Abs(A[piv*n+c]) {
				piv = r
			}
		}
		if math.Abs(A[piv*n+c]) < 1e-300 {
			return nil, false
		}
		if piv != c {
			for j := range n {
				A[c*n+j], A[piv*n+j] = A[piv*n+j], A[c*n+j]
			}
			b[c], b[piv] = b[piv], b[c]
		}
		for r := c + 1; r < n; r++ {
			f := A[r*n+c] / A[c*n+c]
			for j := c; j < n; j++ {
				A[r*n+j] -= f * A[c*n+j]
			}
			b[r] -= f * b[c]
		}
	}
	x := make([]float64, n)
	for i := n - 1; i >= 0; i-- {
		s := b[i]
		for j := i + 1; j < n; j++ {
			s -= A[i*n+j] * x[j]
		}
		x[i] = s / A[i*n+i]
	}
	return x, true
}

// constrainStationary maps unconstrained reals to the coefficients of a
// stationary AR polynomial: each becomes a partial autocorrelation in (−1, 1)
// (x/√(1+x²)), and the Durbin–Levinson recursion turns those into φ.
func constrainStationary(x []float64) []float64 {
	n := len(x)
	phi := make([]float64, n)
	prev := make([]float64, n)
	for k := range n {
		r := x[k] / math.Sqrt(1+x[k]*x[k])
		copy(prev, phi)
		for i := range k {
			phi[i] = prev[i] - r*prev[k-1-i]
		}
		phi[k] = r
	}
	return phi
}

// unconstrainStationary inverts constrainStationary. A non-stationary φ is
// shrunk towards zero until it is stationary.
func unconstrainStationary(phi []float64) []float64 {
	n := len(phi)
	for shrink := 0; shrink < 50; shrink++ {
		cur := append([]float64(nil), phi...)
		x := make([]float64, n)
		ok := true
		for k := n - 1; k >= 0; k-- {
			r := cur[k]
			if math.Abs(r) >= 1 {
				ok = false
				break
			}
			x[k] = r / math.Sqrt(1-r*r)
			prev := make([]float64, k)
			for i := range k {
				prev[i] = (cur[i] + r*cur[k-1-i]) / (1 - r*r)
			}
			copy(cur, prev)
		}
		if ok {
			return x
		}
		for i := range phi {
			phi[i] *= 0.8
		}
	}
	return make([]float64, n)
}
