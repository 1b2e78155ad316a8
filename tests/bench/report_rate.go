package bench

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"
)

// ReportRates writes only the section of the CPU a request costs at a fixed rate, the comparison
// with the baseline gateway when there is one, and the run's errors: the report of a run with
// Config.OnlyRates.
func (r *Results) ReportRates(w io.Writer) error {
	v := reportView{Cfg: r.Cfg, Errors: r.Errors}
	r.fixedRate(&v)
	return reportTemplate.ExecuteTemplate(w, "only-rates", v)
}

// ratesView is the section of the CPU a request costs at a fixed rate (its rounds and phases are
// the Config's).
type ratesView struct {
	LowRate int
	HalfFor time.Duration // a phase at 500 req/s
	Table   table
	Err     error
	Explain *rateExplainView
}

// rateExplainView holds the figures of the explanation of where a request's CPU goes at the low
// rate: the bare proxy's and the Lambda bootstrap's medians, in ms and context switches.
type rateExplainView struct {
	BareCPU, BareSwitches, BootCPU, BootSwitches float64
	Times                                        float64 // the bootstrap's CPU over the bare proxy's
	PerExchange, Five                            float64 // the bare proxy's CPU per HTTP exchange, and five of them
}

// baselineView is the side-by-side comparison with the baseline gateway (its phases' length and
// streams are the Config's).
type baselineView struct {
	Bin    string
	Rounds int // that answered
	Table  table
	Err    error
}

// fixedRate fills the views of the fixed-rate section and of the baseline comparison.
func (r *Results) fixedRate(v *reportView) {
	if rs := r.Rates; len(rs.rows) > 0 || rs.err != nil {
		v.Rates = &ratesView{LowRate: lowRate, HalfFor: r.Cfg.RateFor / 2, Table: rs.table(), Err: rs.err, Explain: rs.explain()}
	}
	if b := r.Baseline; b.bin != "" {
		t := table{Head: []string{"figure", "gateway", "baseline", "gateway / baseline"}}
		row := func(name, format string, f func(i, round int) float64) {
			var g, base, ratio spread
			for round := range b.closed {
				x, y := f(0, round), f(1, round)
				g, base, ratio = append(g, x), append(base, y), append(ratio, x/y)
			}
			t.add(name, g.fmt(format), base.fmt(format), ratio.fmt("%.2f"))
		}
		row("CPU per non-streamed request, 8 connections, µs", "%.1f", func(i, round int) float64 { return cpuPer(b.closed[round][i], "gateway", false) })
		row("CPU per streamed chunk, 8 connections, µs", "%.2f", func(i, round int) float64 { return cpuPer(b.streams[round][i], "gateway", true) })
		row("RSS per idle open stream, KiB", "%.1f", func(i, round int) float64 { return b.idle[round][i] / 1024 })
		v.Baseline = &baselineView{Bin: filepath.Base(b.bin), Rounds: len(b.closed), Table: t, Err: b.err}
	}
}

// table is the rows of the fixed-rate section, with the baseline's columns when a row has one.
func (rs rateResults) table() table {
	base := slices.ContainsFunc(rs.rows, func(row *rateRow) bool { return row.baseline != nil })
	t := table{Head: []string{"process", "store", "rate", "CPU per request, ms", "context switches per request", "p50 latency, ms", "target"}}
	if base {
		t.Head = append(t.Head, "baseline, ms", "gateway / baseline")
	}
	for _, row := range rs.rows {
		cpu := perRound(row.gw, phase.cpuPerRequest)
		target := ""
		if row.target > 0 {
			target = fmt.Sprintf("≤ %.1f ms (issue 19): %s", row.target, verdict(cpu.median() <= row.target))
		}
		cells := []string{row.gateway.name, row.what, fmt.Sprintf("%.0f req/s", row.rate), cpu.fmt("%.3f"),
			perRound(row.gw, phase.switchesPerRequest).fmt("%.1f"),
			perRound(row.gw, func(ph phase) float64 { return ms(ph.total.q(.5)) }).fmt("%.2f"), target}
		switch {
		case row.baseline != nil:
			ratio := make(spread, 0, len(row.gw))
			for i := range min(len(row.gw), len(row.base)) {
				ratio = append(ratio, row.gw[i].cpuPerRequest()/row.base[i].cpuPerRequest())
			}
			cells = append(cells, perRound(row.base, phase.cpuPerRequest).fmt("%.3f"), ratio.fmt("%.2f"))
		case base:
			cells = append(cells, "", "")
		}
		t.add(cells...)
	}
	return t
}

// explain is the figures of where the CPU of a request at a low rate goes, or nil without the
// bare proxy's row or the bootstrap's.
func (rs rateResults) explain() *rateExplainView {
	var floor, boot *rateRow
	for _, row := range rs.rows {
		switch {
		case row.gateway.name == "bare proxy":
			floor = row
		case row.onAWS:
			boot = row
		}
	}
	if floor == nil || boot == nil || len(floor.gw) == 0 || len(boot.gw) == 0 {
		return nil
	}
	med := func(row *rateRow, f func(phase) float64) float64 { return perRound(row.gw, f).median() }
	e := &rateExplainView{BareCPU: med(floor, phase.cpuPerRequest), BareSwitches: med(floor, phase.switchesPerRequest),
		BootCPU: med(boot, phase.cpuPerRequest), BootSwitches: med(boot, phase.switchesPerRequest)}
	e.Times, e.PerExchange = e.BootCPU/e.BareCPU, e.BareCPU/2
	e.Five = e.PerExchange * 5
	return e
}
