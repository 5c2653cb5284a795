package mps

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// Every MPS client reaches its GPU's control endpoint (the CUDA driver asks
// the control daemon for a server through it), and the endpoint takes every
// command the control program sends: a tenant can raise the limits the
// agent set (set_default_active_thread_percentage 100, set_*_pinned_mem_limit)
// as easily as it can quit the daemon. So the limits are read back, not
// trusted: Verify compares what the daemon and each of its servers report
// with what the agent set, and Check restores them.

// Drift is one limit a GPU's daemon or server reports other than the
// agent set it.
type Drift struct {
	// Limit is the control command that reads it, with its arguments
	// ("get_active_thread_percentage 4242").
	Limit string
	Want  string
	Got   string
}

func (d Drift) String() string { return fmt.Sprintf("%s: %s, want %s", d.Limit, d.Got, d.Want) }

// wanted is what a GPU's daemon and servers must hold: the server limits as
// last set, else the GPU's defaults. A zero field is not enforced (no
// memory limit set).
func (m *Manager) wanted(uuid string) (threads int, memMiB int64, ok bool) {
	m.mu.Lock()
	l, set := m.limits[uuid]
	m.mu.Unlock()
	if set {
		return l.ThreadPercent, l.MemoryMiB, true
	}
	for _, g := range m.cfg.GPUs {
		if g.UUID == uuid {
			return g.DefaultThreadPercentage, g.DefaultPinnedMemMiB, true
		}
	}
	return 0, 0, false
}

// limitQuery reads one limit back: the control command, the value the agent
// set, and how to read the answer.
type limitQuery struct {
	command string
	want    int64
	parse   func(string) (int64, error)
}

// Verify reads back the limits the agent set on a GPU's daemon (its
// defaults) and on each of its running servers, and returns those that
// differ. An error means they could not be read: not verified.
func (m *Manager) Verify(ctx context.Context, uuid string) ([]Drift, error) {
	threads, memMiB, ok := m.wanted(uuid)
	if !ok {
		return nil, fmt.Errorf("GPU %s is not one of this node's MPS GPUs", uuid)
	}
	servers, err := m.control(ctx, uuid, "get_server_list")
	if err != nil {
		return nil, fmt.Errorf("GPU %s: get_server_list: %w: %s", uuid, err, servers)
	}
	var queries []limitQuery
	if threads > 0 {
		queries = append(queries, limitQuery{"get_default_active_thread_percentage", int64(threads), ParsePercent})
	}
	if memMiB > 0 {
		queries = append(queries, limitQuery{"get_default_device_pinned_mem_limit 0", memMiB, ParseMemoryMiB})
	}
	for _, pid := range strings.Fields(servers) {
		if threads > 0 {
			queries = append(queries, limitQuery{"get_active_thread_percentage " + pid, int64(threads), ParsePercent})
		}
		if memMiB > 0 {
			queries = append(queries, limitQuery{"get_device_pinned_mem_limit " + pid + " 0", memMiB, ParseMemoryMiB})
		}
	}
	var drift []Drift
	for _, q := range queries {
		out, err := m.control(ctx, uuid, q.command)
		if err != nil {
			return nil, fmt.Errorf("GPU %s: %s: %w: %s", uuid, q.command, err, out)
		}
		got, err := q.parse(out)
		if err != nil {
			return nil, fmt.Errorf("GPU %s: %s answered %q: %w", uuid, q.command, out, err)
		}
		if got != q.want {
			want, have := strconv.FormatInt(q.want, 10), strconv.FormatInt(got, 10)
			if strings.Contains(q.command, "mem_limit") {
				want, have = want+" MiB", have+" MiB"
			} else {
				want, have = want+" %", have+" %"
			}
			drift = append(drift, Drift{Limit: q.command, Want: want, Got: have})
		}
	}
	return drift, nil
}

// Restore sets a GPU's limits again as the agent last set them.
func (m *Manager) Restore(ctx context.Context, uuid string) error {
	m.mu.Lock()
	l, set := m.limits[uuid]
	m.mu.Unlock()
	if set {
		return m.applyServerLimits(ctx, uuid, l)
	}
	for _, g := range m.cfg.GPUs {
		if g.UUID == uuid {
			return m.start(ctx, g)
		}
	}
	return fmt.Errorf("GPU %s is not one of this node's MPS GPUs", uuid)
}

// ParsePercent reads an active thread percentage as the control program
// prints it ("30", "30.0"), rounded to a whole percent.
func ParsePercent(s string) (int64, error) {
	f, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
	if err != nil || f < 0 || f > 100 || math.IsNaN(f) {
		return 0, fmt.Errorf("not a percentage of threads: %q", s)
	}
	return int64(math.Round(f)), nil
}

// ParseMemoryMiB reads a pinned memory limit as the control program takes
// and prints it ("4096M", "4G", "4096MB", "1.5G"; a bare number is MiB),
// in MiB.
func ParseMemoryMiB(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.ToUpper(strings.TrimSpace(s[i:]))
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) {
		return 0, fmt.Errorf("not a memory limit: %q", s)
	}
	scale := map[string]float64{"": 1, "M": 1, "MB": 1, "MIB": 1, "G": 1024, "GB": 1024, "GIB": 1024,
		"K": 1.0 / 1024, "KB": 1.0 / 1024, "KIB": 1.0 / 1024, "T": 1024 * 1024, "TB": 1024 * 1024, "TIB": 1024 * 1024}[unit]
	if scale == 0 {
		return 0, fmt.Errorf("not a memory limit (unit %q): %q", unit, s)
	}
	return int64(math.Round(f * scale)), nil
}
