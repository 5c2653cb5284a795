// Package doctor finds what stands between a node or a cluster and working
// GPU sharing, and says what to do about it. Each check turns facts into
// findings — an id, a severity, the evidence read and a remedy — as a pure
// function; gathering the facts (files, NVML, the API server) is the thin
// layer around it, so every check is tested on recorded fixtures.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Severity orders findings: the worst decides the exit code.
type Severity int

// Severities, mildest first.
const (
	OK Severity = iota
	Info
	Warning
	Error
)

var severityNames = [...]string{"ok", "info", "warning", "error"}

func (s Severity) String() string {
	if s < OK || s > Error {
		return fmt.Sprintf("severity(%d)", int(s))
	}
	return severityNames[s]
}

// MarshalText writes the severity's name.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a severity's name.
func (s *Severity) UnmarshalText(b []byte) error {
	for i, n := range severityNames {
		if n == string(b) {
			*s = Severity(i)
			return nil
		}
	}
	return fmt.Errorf("unknown severity %q: want ok, info, warning or error", b)
}

// Finding is one thing the doctor found.
type Finding struct {
	// ID names the check and the case: "kernel.cgroup-v2", "mps.daemon".
	ID       string   `json:"id"`
	Severity Severity `json:"severity"`
	// Subject is what it is about, when narrower than the node or cluster:
	// a GPU, a pod.
	Subject string `json:"subject,omitempty"`
	// Summary says what was found, in one line.
	Summary string `json:"summary"`
	// Evidence is what was read: a version, a line of a file.
	Evidence string `json:"evidence,omitempty"`
	// Remedy is what to do, in one or two sentences; empty when nothing.
	Remedy string `json:"remedy,omitempty"`
}

// Check is one named check: it gathers what it needs and judges it.
type Check struct {
	ID  string
	Run func(ctx context.Context) []Finding
}

// Run runs the checks concurrently, each under timeout. A check that does
// not finish in time, or fails to run, is a warning saying so — never a
// pass. Findings come back worst first, then by id.
func Run(ctx context.Context, checks []Check, timeout time.Duration) []Finding {
	results := make([][]Finding, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runOne(ctx, c, timeout)
		}()
	}
	wg.Wait()
	var out []Finding
	for _, r := range results {
		out = append(out, r...)
	}
	Sort(out)
	return out
}

func runOne(ctx context.Context, c Check, timeout time.Duration) []Finding {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan []Finding, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- []Finding{{ID: c.ID, Severity: Warning, Summary: "the check failed to run, so it says nothing about this",
					Evidence: fmt.Sprintf("panic: %v\n%s", r, firstLines(string(debug.Stack()), 6)), Remedy: "Report it to Tessera's maintainers with this output."}}
			}
		}()
		done <- c.Run(ctx)
	}()
	select {
	case f := <-done:
		return f
	case <-ctx.Done():
		return []Finding{{ID: c.ID, Severity: Warning, Summary: fmt.Sprintf("the check did not finish within %v, so it says nothing about this", timeout),
			Remedy: "Run it again; if it hangs again, what it reads (NVML, a socket, the API server) is stuck: look there first."}}
	}
}

// Sort orders findings worst first, then by id and subject.
func Sort(fs []Finding) {
	sort.SliceStable(fs, func(i, j int) bool {
		a, b := fs[i], fs[j]
		if a.Severity != b.Severity {
			return a.Severity > b.Severity
		}
		if a.ID != b.ID {
			return a.ID < b.ID
		}
		return a.Subject < b.Subject
	})
}

// Worst is the highest severity among the findings (OK for none).
func Worst(fs []Finding) Severity {
	w := OK
	for _, f := range fs {
		w = max(w, f.Severity)
	}
	return w
}

// ExitCode is the doctor's exit status for the findings: 0 when nothing
// worse than info, 1 for a warning, 2 for an error.
func ExitCode(fs []Finding) int {
	switch Worst(fs) {
	case Error:
		return 2
	case Warning:
		return 1
	}
	return 0
}

// WriteJSON writes the findings as {"worst": …, "findings": […]}.
func WriteJSON(w io.Writer, fs []Finding) error {
	if fs == nil {
		fs = []Finding{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Worst    Severity  `json:"worst"`
		Findings []Finding `json:"findings"`
	}{Worst(fs), fs})
}

// ANSI colours of the severities, used on a terminal only.
var colours = [...]string{"\x1b[32m", "\x1b[36m", "\x1b[33m", "\x1b[31m"}

// Render writes the findings for people: one line each, worst first, with
// the evidence and the remedy indented below; colour only when asked (a
// terminal).
func Render(w io.Writer, fs []Finding, colour bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range fs {
		sev := strings.ToUpper(f.Severity.String())
		if colour {
			sev = colours[f.Severity] + sev + "\x1b[0m"
		}
		subject := f.Subject
		if subject == "" {
			subject = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sev, f.ID, subject, f.Summary)
		if f.Severity > OK {
			if f.Evidence != "" {
				fmt.Fprintf(tw, "\t\t\tfound: %s\n", oneLine(f.Evidence))
			}
			if f.Remedy != "" {
				fmt.Fprintf(tw, "\t\t\tdo: %s\n", f.Remedy)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	counts := map[Severity]int{}
	for _, f := range fs {
		counts[f.Severity]++
	}
	_, err := fmt.Fprintf(w, "%d error(s), %d warning(s), %d info, %d ok\n", counts[Error], counts[Warning], counts[Info], counts[OK])
	return err
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
