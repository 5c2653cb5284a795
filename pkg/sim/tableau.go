package sim

import "errors"

// errLPStalled says the simplex met its iteration limit; errLPUnbounded
// that its problem has no finite optimum.
var (
	errLPStalled   = errors.New("simplex: iteration limit reached")
	errLPUnbounded = errors.New("simplex: unbounded")
)

// simplexDuals solves max c·x subject to A x ≤ b, x ≥ 0, with b ≥ 0, by a
// dense tableau simplex from the slack basis (Dantzig's rule, Bland's
// after a run of degenerate pivots), and returns the optimal dual prices of
// the rows, clipped at 0. The caller turns prices into a bound by weak or
// Lagrangian duality, which holds for any prices ≥ 0: the simplex's
// rounding can make such a bound loose by a hair, never wrong.
func simplexDuals(A [][]float64, b, c []float64) ([]float64, error) {
	m, n := len(A), len(c)
	w := n + m + 1 // x, slacks, right-hand side
	T := make([][]float64, m)
	for i := range m {
		T[i] = make([]float64, w)
		copy(T[i], A[i])
		T[i][n+i] = 1
		T[i][w-1] = b[i]
	}
	obj := make([]float64, w) // reduced costs: z − c·x = 0
	for j := range n {
		obj[j] = -c[j]
	}
	basis := make([]int, m)
	for i := range m {
		basis[i] = n + i
	}
	const tol = 1e-11
	degenerate := 0
	for iter := 0; ; iter++ {
		if iter > 50*(m+n) {
			return nil, errLPStalled
		}
		enter := -1
		if degenerate < 50 {
			best := -tol
			for j := range n + m {
				if obj[j] < best {
					best, enter = obj[j], j
				}
			}
		} else { // Bland: the first improving column, against cycling
			for j := range n + m {
				if obj[j] < -tol {
					enter = j
					break
				}
			}
		}
		if enter < 0 {
			break
		}
		leave := -1
		var ratio float64
		for i := range m {
			if a := T[i][enter]; a > tol {
				r := T[i][w-1] / a
				if leave < 0 || r < ratio-tol || (r <= ratio+tol && basis[i] < basis[leave]) {
					leave, ratio = i, r
				}
			}
		}
		if leave < 0 {
			return nil, errLPUnbounded
		}
		if ratio <= tol {
			degenerate++
		} else {
			degenerate = 0
		}
		pivot(T, obj, leave, enter)
		basis[leave] = enter
	}
	// The dual prices are the reduced costs of the slacks.
	y := make([]float64, m)
	for i := range m {
		y[i] = max(0, obj[n+i])
	}
	return y, nil
}

// pivot makes column enter basic in row leave.
func pivot(T [][]float64, obj []float64, leave, enter int) {
	row := T[leave]
	p := row[enter]
	for j := range row {
		row[j] /= p
	}
	row[enter] = 1
	for i, r := range T {
		if i == leave {
			continue
		}
		if f := r[enter]; f != 0 {
			for j, v := range row {
				if v != 0 {
					r[j] -= f * v
				}
			}
			r[enter] = 0
		}
	}
	if f := obj[enter]; f != 0 {
		for j, v := range row {
			if v != 0 {
				obj[j] -= f * v
			}
		}
		obj[enter] = 0
	}
}
