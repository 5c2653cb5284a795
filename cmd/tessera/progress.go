package main

import (
	"fmt"
	"io"
	"strings"
)

// progressBar draws one line on a terminal: runs done out of all runs, with
// the current run's share, redrawn in place.
type progressBar struct {
	w        io.Writer
	on       bool
	runs     int
	finished int
	last     int // last drawn per-mille, to redraw only on change
}

func newProgressBar(w io.Writer, on bool, runs int) *progressBar {
	return &progressBar{w: w, on: on, runs: runs, last: -1}
}

func (b *progressBar) update(label string, done, total int) {
	if !b.on || total == 0 {
		return
	}
	frac := (float64(b.finished) + float64(done)/float64(total)) / float64(b.runs)
	pm := int(frac * 1000)
	if pm == b.last {
		return
	}
	b.last = pm
	const width = 30
	filled := int(frac * width)
	fmt.Fprintf(b.w, "\r[%s%s] %5.1f%% %-28s", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), frac*100, label)
}

func (b *progressBar) finishRun() { b.finished++ }

func (b *progressBar) done() {
	if b.on && b.last >= 0 {
		fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", 70))
	}
}
