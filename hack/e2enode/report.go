//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// report is the run's list of checks, each with its result and how long it
// took, printed at the end as the closing table.
type report struct {
	start time.Time
	rows  []row
}

type row struct {
	name   string
	ok     bool
	took   time.Duration
	detail string
}

// step runs f as one check named name.
func (r *report) step(name string, f func() error) error {
	return r.detailed(name, func() (string, error) { return "", f() })
}

// detailed runs f as one check whose result carries a detail line.
func (r *report) detailed(name string, f func() (string, error)) error {
	started := time.Now()
	fmt.Printf("… %s\n", name)
	detail, err := f()
	row := row{name: name, ok: err == nil, took: time.Since(started), detail: detail}
	if err != nil {
		row.detail = err.Error()
	}
	r.rows = append(r.rows, row)
	mark := "ok"
	if err != nil {
		mark = "FAILED"
	}
	fmt.Printf("%s %s (%.1f s)%s\n", mark, name, row.took.Seconds(), indent(row.detail))
	return err
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "\n    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// err is nil when every check passed.
func (r *report) err() error {
	var failed []string
	for _, x := range r.rows {
		if !x.ok {
			failed = append(failed, x.name)
		}
	}
	if len(failed) > 0 {
		return errors.New("failed: " + strings.Join(failed, "; "))
	}
	return nil
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nmake e2e-node: %d checks, %.0f s\n", len(r.rows), time.Since(r.start).Seconds())
	for _, x := range r.rows {
		mark := "ok    "
		if !x.ok {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "%s %6.1f s  %s%s\n", mark, x.took.Seconds(), x.name, indent(x.detail))
	}
}
