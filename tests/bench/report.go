package bench

import (
	_ "embed"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// Machine describes where a run happened.
type Machine struct {
	NProc           int
	CPU, Go, Kernel string
	LoadAvg         string // /proc/loadavg when the report is written: other work on a shared machine
}

// ThisMachine reads the machine's description.
func ThisMachine() Machine {
	// go run built this program with the go command that builds the binaries it measures.
	m := Machine{NProc: runtime.NumCPU(), CPU: "unknown", Go: fmt.Sprintf("go version %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.LoadAvg = loadAvg()
	return m
}

// loadAvg is the 1, 5 and 15 minute load averages, "" where /proc/loadavg cannot be read.
func loadAvg() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			return strings.Join(f[:3], " ")
		}
	}
	return ""
}

// perRound is f of each round's measurement: a figure per round.
func perRound[T any](rounds []T, f func(T) float64) spread {
	s := make(spread, 0, len(rounds))
	for _, r := range rounds {
		s = append(s, f(r))
	}
	return s
}

// side picks one phase of a round: the direct call, or the call through one of the proxies.
type side int

const (
	ofDirect side = iota
	ofGateway
	ofBare
)

// of is, per round, f of the phase that via picks.
func of(ps []pair, via side, f func(phase) float64) spread {
	return perRound(ps, func(p pair) float64 { return f(p[via]) })
}

// hasBare reports whether the bare proxy was measured in every round.
func hasBare(ps []pair) bool {
	return len(ps) > 0 && !slices.ContainsFunc(ps, func(p pair) bool { return p[ofBare].elapsed == 0 })
}

// at is a phase's quantile q of time to the first event (ttfb) or of the whole answer.
func (p phase) at(q float64, ttfb bool) time.Duration {
	if ttfb {
		return p.ttfb.q(q)
	}
	return p.total.q(q)
}

func quant(ps []pair, via side, q float64, ttfb bool) spread {
	return of(ps, via, func(ph phase) float64 { return us(ph.at(q, ttfb)) })
}

// added is, per round, what going through via adds to the direct call's quantile q.
func added(ps []pair, via side, q float64, ttfb bool) spread {
	return perRound(ps, func(p pair) float64 { return us(p[via].at(q, ttfb) - p[ofDirect].at(q, ttfb)) })
}

func ratio(ps []pair, via side, q float64, ttfb bool) spread {
	return perRound(ps, func(p pair) float64 { return float64(p[via].at(q, ttfb)) / float64(p[ofDirect].at(q, ttfb)) })
}

// perChunk is a stream phase's median time per event after the first, in µs.
func perChunk(ph phase) float64 {
	if len(ph.total) == 0 {
		return 0
	}
	events := float64(ph.chunks) / float64(len(ph.total))
	return us(ph.total.q(.5)-ph.ttfb.q(.5)) / (events - 1)
}

// cpuPer is the named process's CPU in µs per request (per event when chunks).
func cpuPer(ph phase, proc string, chunks bool) float64 {
	return perUnit(us(ph.cpu[proc]), ph, chunks)
}

// syscallsPer is the named process's read and write system calls per request (per event when
// chunks).
func syscallsPer(ph phase, proc string, chunks bool) float64 {
	return perUnit(float64(ph.syscalls[proc]), ph, chunks)
}

// perUnit divides x by the phase's requests, or by its events when chunks; 0 when there were none.
func perUnit(x float64, ph phase, chunks bool) float64 {
	n := float64(len(ph.total))
	if chunks {
		n = float64(ph.chunks)
	}
	if n == 0 {
		return 0
	}
	return x / n
}

// cpuSpread is, per round, the named process's CPU in µs per request (per event when chunks)
// in the phase that via picks.
func cpuSpread(ps []pair, via side, proc string, chunks bool) spread {
	return of(ps, via, func(ph phase) float64 { return cpuPer(ph, proc, chunks) })
}

// errsOf counts the failed requests of the direct calls and of those through via.
func errsOf(ps []pair, via side) string {
	var direct, through int64
	for _, p := range ps {
		direct += p[ofDirect].errs
		through += p[via].errs
	}
	return fmt.Sprintf("%d / %d", direct, through)
}

// proxy is what stood between the client and the simulator in one row of a comparison.
type proxy struct {
	name string
	via  side
	proc string // its name in the phases' CPU accounting
}

// proxiesOf are the rows of a non-streaming comparison: the gateway, and the bare proxy when
// it was measured; none without rounds.
func proxiesOf(ps []pair) []proxy {
	if len(ps) == 0 {
		return nil
	}
	rows := []proxy{{"gateway", ofGateway, "gateway"}}
	if hasBare(ps) {
		rows = append(rows, proxy{"bare proxy", ofBare, "bareproxy"})
	}
	return rows
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func connections(n int) string {
	if n == 1 {
		return "1 connection"
	}
	return fmt.Sprintf("%d connections", n)
}

// reportMarkdown is BENCHMARKS.md's prose and layout; Report fills it with a reportView.
//
//go:embed report.md.tmpl
var reportMarkdown string

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"verdict":    verdict,
	"spread":     func(format string, s spread) string { return s.fmt(format) },
	"list":       func(xs ...any) []any { return xs },
	"median":     spread.median,
	"trimPrefix": strings.TrimPrefix,
	"kib":        kib,
	"usd":        func(d dollars) string { return fmt.Sprintf("%.2f | %.2f", d.Before, d.Now) },
	"div":        func(a, b float64) float64 { return a / b },
}).Parse(reportMarkdown))

// table is a markdown table: a header and rows of cells.
type table struct {
	Head []string
	Rows [][]string
}

func (t *table) add(cells ...string) { t.Rows = append(t.Rows, cells) }

// reportView is what the template shows: the run's figures computed, its tables laid out in cells.
type reportView struct {
	Cfg       Config
	M         Machine
	Command   string
	Started   string
	LoadStart string
	Targets   targetsView
	Bare      *struct{ BareP50, BareP99, GatewayP50, GatewayP99 float64 }
	Bound     *cpuBoundView
	Closed    table
	Open      *table
	Streaming table
	Short     *struct{ Direct, Gateway, Errors string } // 16-token streams at 8 connections
	CPU       table
	Memory    *memory // with streams measured
	Cold      cold
	GoBench   *goBenchView
	Store     *storeView
	Errors    []string
	// Rates, Baseline and Cost are computed in report_rate.go and report_cost.go.
	Rates    *ratesView
	Baseline *baselineView
	Cost     *costView
}

// storeView is the stores' admission and settlement: the embedded store's from the Go
// micro-benchmarks, the DynamoDB store's from Command, Ops of each per run.
type storeView struct {
	Command  string
	Ops      int
	SQLite   *goBench
	DynamoDB []*goBench
}

type goBenchView struct {
	Command            string
	List               []*goBench
	Hot, Chunk         *overhead // what the gateway adds per non-streamed request, and per relayed chunk
	Long, Short, Extra int       // BenchmarkStreamChunk's streams, in tokens, and how many more the long one has
}

// Report writes the results as the markdown of BENCHMARKS.md.
func (r *Results) Report(w io.Writer, m Machine, command string) error {
	v := reportView{Cfg: r.Cfg, M: m, Command: command, Cold: r.Cold, Started: r.Started.Format(time.RFC3339), LoadStart: r.LoadStart, Errors: r.Errors}
	for _, fill := range []func(*reportView){r.targets, r.latency, r.streaming, r.cpu, r.goBench, r.fixedRate, r.lambdaCost} {
		fill(&v)
	}
	if r.Memory.Streams > 0 {
		v.Memory = &r.Memory
	}
	return reportTemplate.Execute(w, v)
}

// targetsView is what the targets table compares with the issues' bounds (the cold starts it
// reads from Results.Cold); an empty spread was not measured.
type targetsView struct {
	Added50, Added99, Rate, Direct spread // non-streamed requests at 8 connections, µs and req/s
	Chunk                          spread // time added per streamed chunk at 1 connection, µs
	CPU1, CPU8                     spread // the gateway's CPU per relayed chunk at 1 and 8 connections, µs
	Allocs                         spread // allocations added per relayed chunk (the Go benchmark: one figure)
	RSS, BareRSS, Live             spread // KiB per idle open stream (Live: one figure)
}

func (r *Results) targets(v *reportView) {
	t := &v.Targets
	if ps := r.Closed[8]; len(ps) > 0 {
		t.Added50, t.Added99 = added(ps, ofGateway, .5, false), added(ps, ofGateway, .99, false)
		t.Rate, t.Direct = of(ps, ofGateway, phase.rate), of(ps, ofDirect, phase.rate)
		if hasBare(ps) {
			v.Bare = &struct{ BareP50, BareP99, GatewayP50, GatewayP99 float64 }{
				added(ps, ofBare, .5, false).median(), added(ps, ofBare, .99, false).median(), t.Added50.median(), t.Added99.median()}
		}
		if cpuPer(ps[0][ofGateway], "loadgen", false) > 0 {
			v.Bound = newCPUBound(ps, v.M.NProc)
		}
	}
	if ps := r.Long[1]; len(ps) > 0 {
		t.Chunk = perRound(ps, func(p pair) float64 { return perChunk(p[ofGateway]) - perChunk(p[ofDirect]) })
	}
	t.CPU1, t.CPU8 = cpuSpread(r.Long[1], ofGateway, "gateway", true), cpuSpread(r.Long[8], ofGateway, "gateway", true)
	if a := relayPerChunk(r.GoBench); a != nil {
		t.Allocs = spread{a.Allocs}
	}
	t.RSS, t.BareRSS = r.Memory.perStream(ofGateway), r.Memory.perStream(ofBare)
	if l := r.Memory.Live; l.Opened > 0 {
		t.Live = spread{kib(l.PerStream.Total())}
	}
}

// latencyRow is one proxy's row of the closed- or open-loop table, its rates among the cells
// when rates.
func latencyRow(first string, ps []pair, x proxy, rates bool) []string {
	q3 := func(via side) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f", quant(ps, via, .5, false).median(), quant(ps, via, .99, false).median(), quant(ps, via, .999, false).median())
	}
	row := []string{first, x.name, q3(ofDirect), q3(x.via),
		added(ps, x.via, .5, false).fmt("%.0f"), added(ps, x.via, .99, false).fmt("%.0f"), added(ps, x.via, .999, false).fmt("%.0f"),
		ratio(ps, x.via, .5, false).fmt("%.2f"), ratio(ps, x.via, .99, false).fmt("%.2f")}
	if rates {
		row = append(row, of(ps, ofDirect, phase.rate).fmt("%.0f"), of(ps, x.via, phase.rate).fmt("%.0f"))
	}
	return append(row, errsOf(ps, x.via))
}

func (r *Results) latency(v *reportView) {
	head := []string{"direct p50 / p99 / p99.9", "proxy p50 / p99 / p99.9", "added p50", "added p99", "added p99.9", "ratio p50", "ratio p99"}
	v.Closed = table{Head: slices.Concat([]string{"connections", "proxy"}, head, []string{"direct req/s", "proxy req/s", "errors (direct/proxy)"})}
	for _, n := range slices.Sorted(maps.Keys(r.Closed)) {
		for _, x := range proxiesOf(r.Closed[n]) {
			v.Closed.add(latencyRow(strconv.Itoa(n), r.Closed[n], x, true)...)
		}
	}
	if ps := r.Open; len(ps) > 0 {
		v.Open = &table{Head: slices.Concat([]string{"rate", "proxy"}, head, []string{"errors (direct/proxy)"})}
		for _, x := range proxiesOf(ps) {
			v.Open.add(latencyRow(fmt.Sprintf("%.0f req/s", r.Cfg.OpenRate), ps, x, false)...)
		}
	}
}

func (r *Results) streaming(v *reportView) {
	t := table{Head: []string{"measure", "direct p50", "gateway p50", "added p50", "ratio p50", "direct p99", "gateway p99", "added p99", "ratio p99"}}
	row := func(name string, ps []pair, ttfb bool) {
		cells := []string{name}
		for _, q := range []float64{.5, .99} {
			cells = append(cells, fmt.Sprintf("%.0f", quant(ps, ofDirect, q, ttfb).median()), fmt.Sprintf("%.0f", quant(ps, ofGateway, q, ttfb).median()),
				added(ps, ofGateway, q, ttfb).fmt("%.0f"), ratio(ps, ofGateway, q, ttfb).fmt("%.2f"))
		}
		t.add(cells...)
	}
	for _, s := range []struct {
		name     string
		ps       []pair
		perChunk bool
	}{{"16-token stream, 8 connections", r.Short, false}, {"1,000-token stream, 1 connection", r.Long[1], true}, {"1,000-token stream, 8 connections", r.Long[8], true}} {
		if len(s.ps) == 0 {
			continue
		}
		row(s.name+": first event", s.ps, true)
		row(s.name+": whole stream", s.ps, false)
		if ps := s.ps; s.perChunk {
			t.add(s.name+": per chunk (median)", fmt.Sprintf("%.2f", of(ps, ofDirect, perChunk).median()), fmt.Sprintf("%.2f", of(ps, ofGateway, perChunk).median()),
				perRound(ps, func(p pair) float64 { return perChunk(p[ofGateway]) - perChunk(p[ofDirect]) }).fmt("%.2f"),
				perRound(ps, func(p pair) float64 { return perChunk(p[ofGateway]) / perChunk(p[ofDirect]) }).fmt("%.2f"), "", "", "", "")
		}
	}
	v.Streaming = t
	if ps := r.Short; len(ps) > 0 {
		v.Short = &struct{ Direct, Gateway, Errors string }{of(ps, ofDirect, phase.rate).fmt("%.0f"), of(ps, ofGateway, phase.rate).fmt("%.0f"), errsOf(ps, ofGateway)}
	}
}

func (r *Results) cpu(v *reportView) {
	t := table{Head: []string{"measure", "simulator", "proxy", "ratio"}}
	closed := r.Closed[8]
	for _, x := range proxiesOf(closed) {
		t.add("µs CPU per non-streamed request, 8 connections, "+x.name, cpuSpread(closed, ofDirect, "simulator", false).fmt("%.1f"),
			fmt.Sprintf("%s [%s]", cpuSpread(closed, x.via, x.proc, false).fmt("%.1f"), cpuSpread(closed, x.via, "simulator", false).fmt("%.1f")),
			perRound(closed, func(p pair) float64 { return cpuPer(p[x.via], x.proc, false) / cpuPer(p[ofDirect], "simulator", false) }).fmt("%.2f"))
	}
	for _, n := range []int{1, 8} {
		if ps := r.Long[n]; len(ps) > 0 {
			t.add("µs CPU per streamed chunk, 1,000-token streams, "+connections(n), cpuSpread(ps, ofDirect, "simulator", true).fmt("%.2f"),
				fmt.Sprintf("%s [%s]", cpuSpread(ps, ofGateway, "gateway", true).fmt("%.2f"), cpuSpread(ps, ofGateway, "simulator", true).fmt("%.2f")),
				perRound(ps, func(p pair) float64 {
					return cpuPer(p[ofGateway], "gateway", true) / cpuPer(p[ofDirect], "simulator", true)
				}).fmt("%.2f"))
		}
	}
	for _, n := range []int{1, 8} {
		if ps := r.Long[n]; len(ps) > 0 {
			t.add("chunks/s relayed per CPU core (1 / CPU per chunk), "+connections(n), fmt.Sprintf("%.0f", 1e6/cpuSpread(ps, ofDirect, "simulator", true).median()),
				fmt.Sprintf("%.0f", 1e6/cpuSpread(ps, ofGateway, "gateway", true).median()), "")
		}
	}
	for _, x := range proxiesOf(closed) {
		t.add("system calls per non-streamed request, 8 connections, "+x.name, of(closed, ofDirect, func(ph phase) float64 { return syscallsPer(ph, "simulator", false) }).fmt("%.1f"),
			of(closed, x.via, func(ph phase) float64 { return syscallsPer(ph, x.proc, false) }).fmt("%.1f"), "")
	}
	for _, n := range []int{1, 8} {
		if ps := r.Long[n]; len(ps) > 0 {
			t.add("system calls per streamed chunk, 1,000-token streams, "+connections(n),
				of(ps, ofDirect, func(ph phase) float64 { return syscallsPer(ph, "simulator", true) }).fmt("%.3f"),
				of(ps, ofGateway, func(ph phase) float64 { return syscallsPer(ph, "gateway", true) }).fmt("%.3f"), "")
		}
	}
	v.CPU = t
}

// Table is the memory section's table: what the streams held in each process, medians over the
// rounds.
func (m memory) Table() table {
	t := table{Head: []string{"process", "streams open", "RSS before, MiB", "RSS with streams, MiB", "per open stream, KiB"}}
	for _, row := range []struct {
		name   string
		via    side
		behind bool
	}{{"simulator, called directly", ofDirect, false}, {"gateway", ofGateway, false}, {"simulator, behind the gateway", ofGateway, true},
		{"bare proxy", ofBare, false}, {"simulator, behind the bare proxy", ofBare, true}} {
		hs := m.held(row.via, row.behind)
		median := func(format string, f func(held) float64) string { return fmt.Sprintf(format, perRound(hs, f).median()) }
		t.add(row.name, median("%.0f", func(h held) float64 { return float64(h.opened) }),
			median("%.1f", func(h held) float64 { return float64(h.before) / (1 << 20) }), median("%.1f", func(h held) float64 { return float64(h.with) / (1 << 20) }),
			perRound(hs, func(h held) float64 { return kib(h.perStream()) }).fmt("%.1f"))
	}
	return t
}

func (r *Results) goBench(v *reportView) {
	if len(r.GoBench) > 0 {
		gv := &goBenchView{Command: r.GoCmd, List: r.GoBench, Chunk: relayPerChunk(r.GoBench),
			Long: longChunkTokens, Short: shortChunkTokens, Extra: longChunkTokens - shortChunkTokens}
		if g, s := findGoBench(r.GoBench, "BenchmarkChat/gateway"), findGoBench(r.GoBench, "BenchmarkChat/simulator"); g != nil && s != nil {
			more := func(unit string) float64 { return g.Values[unit].median() - s.Values[unit].median() }
			gv.Hot = &overhead{more("allocs/op"), more("B/op"), more("ns/op") / 1000}
		}
		v.GoBench = gv
	}
	sq := findGoBench(r.GoBench, "BenchmarkAdmitSettle")
	if sq == nil && len(r.Store) == 0 {
		return
	}
	v.Store = &storeView{Command: r.StoreCmd, Ops: storeBenchOps, SQLite: sq, DynamoDB: r.Store}
}

// cpuBoundView explains the 8-connection latency figures by the CPU a request costs: the closed
// loop keeps the cores busy, so that latency is mostly the wait for them.
type cpuBoundView struct {
	ThroughGateway, Direct             float64 // mean latency by Little's law, µs
	Gateway, Simulator, LoadGen, Total float64 // CPU per request through the gateway, µs
	Cores                              int
	MaxRate, Need, Budget              float64
	HasBare                            bool
	Bare                               float64
}

func newCPUBound(ps []pair, cores int) *cpuBoundView {
	cpu := func(via side, proc string) float64 { return cpuSpread(ps, via, proc, false).median() }
	xd, xg := of(ps, ofDirect, phase.rate).median(), of(ps, ofGateway, phase.rate).median()
	b := &cpuBoundView{ThroughGateway: 8 / xg * 1e6, Direct: 8 / xd * 1e6, Cores: cores,
		Gateway: cpu(ofGateway, "gateway"), Simulator: cpu(ofGateway, "simulator"), LoadGen: cpu(ofGateway, "loadgen")}
	b.Total = b.Gateway + b.Simulator + b.LoadGen
	b.MaxRate = float64(cores) / b.Total * 1e6
	b.Need = 8 / (8/xd + 300e-6)
	b.Budget = float64(cores) / b.Need * 1e6
	if hasBare(ps) {
		b.HasBare, b.Bare = true, cpu(ofBare, "bareproxy")
	}
	return b
}
