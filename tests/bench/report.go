package bench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
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
	m := Machine{NProc: runtime.NumCPU(), CPU: "unknown", Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out))
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

// per-round figures of a list of pairs.
func perRound(ps []pair, f func(p pair) float64) spread {
	s := make(spread, 0, len(ps))
	for _, p := range ps {
		s = append(s, f(p))
	}
	return s
}

// side picks one phase of a round: the direct call, or the call through one of the proxies.
type side func(pair) phase

func ofDirect(p pair) phase  { return p.direct }
func ofGateway(p pair) phase { return p.gateway }
func ofBare(p pair) phase    { return p.bare }

// hasBare reports whether the bare proxy was measured in every round.
func hasBare(ps []pair) bool {
	return len(ps) > 0 && !slices.ContainsFunc(ps, func(p pair) bool { return p.bare.elapsed == 0 })
}

// at is a phase's quantile q of time to the first event (ttfb) or of the whole answer.
func at(ph phase, q float64, ttfb bool) time.Duration {
	if ttfb {
		return ph.ttfb.q(q)
	}
	return ph.total.q(q)
}

func quant(ps []pair, via side, q float64, ttfb bool) spread {
	return perRound(ps, func(p pair) float64 { return us(at(via(p), q, ttfb)) })
}

// added is, per round, what going through via adds to the direct call's quantile q.
func added(ps []pair, via side, q float64, ttfb bool) spread {
	return perRound(ps, func(p pair) float64 { return us(at(via(p), q, ttfb) - at(p.direct, q, ttfb)) })
}

func ratio(ps []pair, via side, q float64, ttfb bool) spread {
	return perRound(ps, func(p pair) float64 { return float64(at(via(p), q, ttfb)) / float64(at(p.direct, q, ttfb)) })
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

// errsOf counts the failed requests of the direct calls and of those through via.
func errsOf(ps []pair, via side) (direct, through int64) {
	for _, p := range ps {
		direct += p.direct.errs
		through += via(p).errs
	}
	return direct, through
}

// proxy is what stood between the client and the simulator in one row of a comparison.
type proxy struct {
	name string
	via  side
	proc string // its name in the phases' CPU accounting
}

// proxiesOf are the rows of a non-streaming comparison: the gateway, and the bare proxy when
// it was measured.
func proxiesOf(ps []pair) []proxy {
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

// Report writes the results as the markdown of BENCHMARKS.md.
func (r *Results) Report(w io.Writer, m Machine, command string) {
	c := r.Cfg
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("# Kiln gateway benchmarks")
	p("")
	p("What the gateway adds to a model server. Every figure is measured against a baseline taken in the same run: the")
	p("same load sent to the model simulator directly (a separate process, `tests/bench/cmd/simserver`) and through the")
	p("gateway binary (`functions/gateway`, embedded SQLite store, reference catalog pointed at that simulator). The two are")
	p("measured in alternating order, %d rounds each; figures are the median over the rounds and `(lo … hi)` their range.", c.Rounds)
	p("In the non-streaming phases a third process takes the gateway's place in the same rounds: a bare")
	p("`httputil.ReverseProxy` (`tests/bench/cmd/bareproxy`: no authentication, no store, no look at the body), sent")
	p("exactly what the simulator is sent; what it adds is what any Go net/http proxy adds on this machine.")
	p("The load generator (net/http keep-alive clients) runs on the same machine, so all the processes share its cores.")
	p("")
	p("- Machine: %d CPUs (`nproc`), %s, Linux %s", m.NProc, m.CPU, m.Kernel)
	p("- Go: %s", m.Go)
	p("- Date: %s; load average at the start %s, at the end %s (1, 5, 15 min; on %d CPUs, anything well above the load the run itself", r.Started.Format(time.RFC3339), r.LoadStart, m.LoadAvg, m.NProc)
	p("  puts on the machine, about 2, means other work shared the cores and the figures are pessimistic)")
	p("- Command: `%s`", command)
	p("- Phases: %v measured per closed-loop phase after %v of warm-up; open loop %.0f req/s for %v; %d slow streams; %d cold starts",
		c.Duration, c.Warmup, c.OpenRate, c.OpenFor, c.Streams, c.ColdStarts)
	p("- Requests: chat completion of `qwen3-32b` (the simulator's `Qwen/Qwen3-32B`), 2 messages, 16 tokens (1,000 for long")
	p("  streams). Streaming requests to the simulator carry what the gateway forwards (`include_usage` and")
	p("  `continuous_usage_stats`), so it does the same work either way.")
	p("")

	// Targets.
	p("## Targets")
	p("")
	p("| target | from | measured | |")
	p("| --- | --- | --- | --- |")
	if ps := r.Closed[8]; len(ps) > 0 {
		a50, a99 := added(ps, ofGateway, .5, false), added(ps, ofGateway, .99, false)
		p("| added p50, non-streaming, 8 connections < 500 µs | issue 2 | %s µs | %s |", a50.fmt("%.0f"), verdict(a50.median() < 500))
		p("| added p99, non-streaming, 8 connections < 2 ms | issue 2 | %s µs | %s |", a99.fmt("%.0f"), verdict(a99.median() < 2000))
		p("| added p50 ≤ 0.3 ms | issue 6 | %s µs | %s |", a50.fmt("%.0f"), verdict(a50.median() <= 300))
		p("| added p99 ≤ 1.5 ms | issue 6 | %s µs | %s |", a99.fmt("%.0f"), verdict(a99.median() <= 1500))
		gw := perRound(ps, func(p pair) float64 { return p.gateway.rate() })
		di := perRound(ps, func(p pair) float64 { return p.direct.rate() })
		p("| ≥ 3,000 req/s through the gateway at 8 connections (simulator alone: %s) | issue 6 | %s req/s | %s |",
			di.fmt("%.0f"), gw.fmt("%.0f"), verdict(gw.median() >= 3000))
	}
	if ps := r.Long[1]; len(ps) > 0 {
		pc := perRound(ps, func(p pair) float64 { return perChunk(p.gateway) - perChunk(p.direct) })
		p("| added time per streamed chunk < 5 µs (1,000-token streams, 1 connection) | issue 2 | %s µs | %s |", pc.fmt("%.2f"), verdict(pc.median() < 5))
	}
	cpuNote := false
	if one, eight := gatewayCPUPerChunk(r.Long[1]), gatewayCPUPerChunk(r.Long[8]); len(one) > 0 || len(eight) > 0 {
		p("| gateway CPU per relayed chunk ≤ 3 µs (1,000-token streams) | issue 6 | 1 conn: %s µs; 8 conns: %s µs | %s |",
			one.fmt("%.2f"), eight.fmt("%.2f"), verdict(len(eight) > 0 && eight.median() <= 3))
		cpuNote = true
	}
	if a, ok := relayPerChunk(r.GoBench, "allocs/op"); ok {
		p("| ≤ 2 allocations added per relayed chunk (Go benchmark) | issue 6 | %.2f | %s |", a, verdict(a <= 2))
	}
	if mm := r.Memory; mm.gatewayOpen > 0 {
		per := float64(mm.gwOpen-mm.gwIdle) / float64(mm.gatewayOpen)
		bare := ""
		if mm.proxyOpened > 0 {
			bare = fmt.Sprintf(" (bare proxy: %.1f KiB)", float64(mm.proxyOpen-mm.proxyIdle)/float64(mm.proxyOpened)/1024)
		}
		live, liveOK := "not measured", false
		if l := mm.live; l.opened > 0 {
			live, liveOK = fmt.Sprintf("%.1f KiB", kib(l.perStream.total())), l.perStream.total() <= 32*1024
		}
		p("| ≤ 32 KiB per idle open stream | issue 6 | RSS %.1f KiB%s; live heap and stacks %s | %s |", per/1024, bare, live, verdict(per <= 32*1024 && liveOK))
	}
	if len(r.Cold.gateway) > 0 {
		p("| cold start to first 200 ≤ 50 ms (local server) | issue 6 | %s ms | %s |", r.Cold.gateway.fmt("%.1f"), verdict(r.Cold.gateway.median() <= 50))
	}
	if lc := r.Cold.lambda; len(lc.sqlite.cold) > 0 {
		// The targets are for the embedded store; on DynamoDB Local the first answer
		// waits for that server's round trips, which a warm invocation shows alone.
		dynamo := "not measured"
		if len(lc.dynamo.cold) > 0 {
			dynamo = fmt.Sprintf("%s ms, of which a warm invocation's own %s ms", lc.dynamo.cold.fmt("%.1f"), lc.dynamo.warm.fmt("%.1f"))
		}
		p("| cold start to first 200 ≤ 50 ms (Lambda bootstrap, embedded store) | issue 6 | %s ms (on DynamoDB Local: %s) | %s |",
			lc.sqlite.cold.fmt("%.1f"), dynamo, verdict(lc.sqlite.cold.median() <= 50))
	}
	p("")
	if ps := r.Closed[8]; hasBare(ps) {
		p("A bare `httputil.ReverseProxy` adds %.0f / %.0f µs (p50 / p99, median over the rounds) at 8 connections in the same run; the gateway adds %.0f / %.0f µs.",
			added(ps, ofBare, .5, false).median(), added(ps, ofBare, .99, false).median(),
			added(ps, ofGateway, .5, false).median(), added(ps, ofGateway, .99, false).median())
		p("")
	}
	if ps := r.Closed[8]; len(ps) > 0 && cpuPer(ps[0].gateway, "loadgen", false) > 0 {
		cpuBound(p, ps, m.NProc)
	}
	if cpuNote {
		p("The 8-connection figure decides the CPU-per-chunk target: capacity is measured with the gateway busy, when each read finds several chunks waiting.")
		p("")
	}

	// Closed loop.
	p("## Added latency, non-streaming, closed loop")
	p("")
	p("Each connection sends its next request when the last answer ended. Latency is from sending the request to the")
	p("end of the answer's body. Each connection count has a row for the gateway and one for the bare proxy, both against")
	p("the direct phases of the same rounds. Quantiles in µs.")
	p("")
	p("| connections | proxy | direct p50 / p99 / p99.9 | proxy p50 / p99 / p99.9 | added p50 | added p99 | added p99.9 | ratio p50 | ratio p99 | direct req/s | proxy req/s | errors (direct/proxy) |")
	p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	conns := make([]int, 0, len(r.Closed))
	for n := range r.Closed {
		conns = append(conns, n)
	}
	slices.Sort(conns)
	// latencyRow is one proxy's row of the closed- or open-loop table, after its first cells.
	latencyRow := func(first string, ps []pair, via side, rates bool) {
		de, pe := errsOf(ps, via)
		rateCells := ""
		if rates {
			rateCells = fmt.Sprintf(" %s | %s |", perRound(ps, func(p pair) float64 { return p.direct.rate() }).fmt("%.0f"),
				perRound(ps, func(p pair) float64 { return via(p).rate() }).fmt("%.0f"))
		}
		p("| %s | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f | %s | %s | %s | %s | %s |%s %d / %d |", first,
			quant(ps, ofDirect, .5, false).median(), quant(ps, ofDirect, .99, false).median(), quant(ps, ofDirect, .999, false).median(),
			quant(ps, via, .5, false).median(), quant(ps, via, .99, false).median(), quant(ps, via, .999, false).median(),
			added(ps, via, .5, false).fmt("%.0f"), added(ps, via, .99, false).fmt("%.0f"), added(ps, via, .999, false).fmt("%.0f"),
			ratio(ps, via, .5, false).fmt("%.2f"), ratio(ps, via, .99, false).fmt("%.2f"), rateCells, de, pe)
	}
	for _, n := range conns {
		ps := r.Closed[n]
		for _, x := range proxiesOf(ps) {
			latencyRow(fmt.Sprintf("%d | %s", n, x.name), ps, x.via, true)
		}
	}
	p("")
	if ps := r.Open; len(ps) > 0 {
		p("## Added latency, non-streaming, open loop")
		p("")
		p("Requests are sent at a fixed rate whatever the answers' pace, each timed from the moment it was due (so a stall")
		p("shows as latency, not as a slower load). Quantiles in µs.")
		p("")
		p("| rate | proxy | direct p50 / p99 / p99.9 | proxy p50 / p99 / p99.9 | added p50 | added p99 | added p99.9 | ratio p50 | ratio p99 | errors (direct/proxy) |")
		p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, x := range proxiesOf(ps) {
			latencyRow(fmt.Sprintf("%.0f req/s | %s", c.OpenRate, x.name), ps, x.via, false)
		}
		p("")
	}

	// Streaming.
	p("## Streaming")
	p("")
	p("Time to first byte is until the first `data:` event arrived; per chunk is (median total − median first event) /")
	p("(events − 1). Times in µs.")
	p("")
	p("| measure | direct p50 | gateway p50 | added p50 | ratio p50 | direct p99 | gateway p99 | added p99 | ratio p99 |")
	p("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	row := func(name string, ps []pair, ttfb bool) {
		if len(ps) == 0 {
			return
		}
		p("| %s | %.0f | %.0f | %s | %s | %.0f | %.0f | %s | %s |", name,
			quant(ps, ofDirect, .5, ttfb).median(), quant(ps, ofGateway, .5, ttfb).median(), added(ps, ofGateway, .5, ttfb).fmt("%.0f"), ratio(ps, ofGateway, .5, ttfb).fmt("%.2f"),
			quant(ps, ofDirect, .99, ttfb).median(), quant(ps, ofGateway, .99, ttfb).median(), added(ps, ofGateway, .99, ttfb).fmt("%.0f"), ratio(ps, ofGateway, .99, ttfb).fmt("%.2f"))
	}
	row("16-token stream, 8 connections: first event", r.Short, true)
	row("16-token stream, 8 connections: whole stream", r.Short, false)
	for _, n := range []int{1, 8} {
		ps := r.Long[n]
		row(fmt.Sprintf("1,000-token stream, %s: first event", connections(n)), ps, true)
		row(fmt.Sprintf("1,000-token stream, %s: whole stream", connections(n)), ps, false)
		if len(ps) == 0 {
			continue
		}
		d := perRound(ps, func(p pair) float64 { return perChunk(p.direct) })
		g := perRound(ps, func(p pair) float64 { return perChunk(p.gateway) })
		a := perRound(ps, func(p pair) float64 { return perChunk(p.gateway) - perChunk(p.direct) })
		rt := perRound(ps, func(p pair) float64 { return perChunk(p.gateway) / perChunk(p.direct) })
		p("| 1,000-token stream, %s: per chunk (median) | %.2f | %.2f | %s | %s | | | | |", connections(n), d.median(), g.median(), a.fmt("%.2f"), rt.fmt("%.2f"))
	}
	if ps := r.Short; len(ps) > 0 {
		de, ge := errsOf(ps, ofGateway)
		p("")
		p("16-token streams at 8 connections: %s streams/s direct, %s through the gateway; errors %d / %d.",
			perRound(ps, func(p pair) float64 { return p.direct.rate() }).fmt("%.0f"),
			perRound(ps, func(p pair) float64 { return p.gateway.rate() }).fmt("%.0f"), de, ge)
	}
	p("")

	// CPU.
	p("## CPU")
	p("")
	p("User + system CPU of each process over the measured window, from the kernel's accounting of it (`/proc/PID/stat`")
	p("utime + stime, the counters `getrusage` reports; 10 ms ticks). \"Simulator\" is the simulator's CPU when called")
	p("directly; \"proxy\" is the gateway process's alone, or on the bare-proxy row the bare proxy's (the simulator's CPU")
	p("during that phase in brackets); \"ratio\" is proxy / simulator.")
	p("1,000-token streams run at 1 connection, where the cores are mostly idle: each of the gateway's reads finds fewer")
	p("chunks, and its threads are put to sleep and woken more often (polls and sleeps, which the system-call rows do not")
	p("count); and at 8 (closed loop), where the gateway is busy and its reads find more chunks waiting: the figure that")
	p("bounds how many chunks a core can relay. The system-call rows count each process's read- and write-family calls")
	p("(`/proc/PID/io` syscr + syscw; the gateway's include its SQLite store's), reads that found nothing included. A CPU")
	p("profile of the 8-connection streams (`kilnbench -profile`) puts about half of the gateway's CPU in system calls: how")
	p("many chunks each read finds, which the machine's pace decides, moves its CPU per chunk more than anything the")
	p("gateway does with a chunk.")
	p("")
	p("| measure | simulator | proxy | ratio |")
	p("| --- | --- | --- | --- |")
	if ps := r.Closed[8]; len(ps) > 0 {
		s := perRound(ps, func(p pair) float64 { return cpuPer(p.direct, "simulator", false) })
		for _, x := range proxiesOf(ps) {
			own := perRound(ps, func(p pair) float64 { return cpuPer(x.via(p), x.proc, false) })
			sim := perRound(ps, func(p pair) float64 { return cpuPer(x.via(p), "simulator", false) })
			p("| µs CPU per non-streamed request, 8 connections, %s | %s | %s [%s] | %s |", x.name, s.fmt("%.1f"), own.fmt("%.1f"), sim.fmt("%.1f"),
				perRound(ps, func(p pair) float64 { return cpuPer(x.via(p), x.proc, false) / cpuPer(p.direct, "simulator", false) }).fmt("%.2f"))
		}
	}
	for _, n := range []int{1, 8} {
		ps := r.Long[n]
		if len(ps) == 0 {
			continue
		}
		s := perRound(ps, func(p pair) float64 { return cpuPer(p.direct, "simulator", true) })
		g := gatewayCPUPerChunk(ps)
		sg := perRound(ps, func(p pair) float64 { return cpuPer(p.gateway, "simulator", true) })
		p("| µs CPU per streamed chunk, 1,000-token streams, %s | %s | %s [%s] | %s |", connections(n), s.fmt("%.2f"), g.fmt("%.2f"), sg.fmt("%.2f"),
			perRound(ps, func(p pair) float64 { return cpuPer(p.gateway, "gateway", true) / cpuPer(p.direct, "simulator", true) }).fmt("%.2f"))
	}
	for _, n := range []int{1, 8} {
		if ps := r.Long[n]; len(ps) > 0 {
			s := perRound(ps, func(p pair) float64 { return cpuPer(p.direct, "simulator", true) })
			p("| chunks/s relayed per CPU core (1 / CPU per chunk), %s | %.0f | %.0f | |", connections(n), 1e6/s.median(), 1e6/gatewayCPUPerChunk(ps).median())
		}
	}
	if ps := r.Closed[8]; len(ps) > 0 {
		s := perRound(ps, func(p pair) float64 { return syscallsPer(p.direct, "simulator", false) })
		for _, x := range proxiesOf(ps) {
			p("| system calls per non-streamed request, 8 connections, %s | %s | %s | |", x.name, s.fmt("%.1f"),
				perRound(ps, func(p pair) float64 { return syscallsPer(x.via(p), x.proc, false) }).fmt("%.1f"))
		}
	}
	for _, n := range []int{1, 8} {
		if ps := r.Long[n]; len(ps) > 0 {
			p("| system calls per streamed chunk, 1,000-token streams, %s | %s | %s | |", connections(n),
				perRound(ps, func(p pair) float64 { return syscallsPer(p.direct, "simulator", true) }).fmt("%.3f"),
				perRound(ps, func(p pair) float64 { return syscallsPer(p.gateway, "gateway", true) }).fmt("%.3f"))
		}
	}
	p("")

	// Memory.
	if mm := r.Memory; mm.streams > 0 {
		p("## Memory: %d concurrent open streams", mm.streams)
		p("")
		p("Streams of 1,000 tokens one second apart (`[[sim:delay_ms=1000]]`), held open after their first event; RSS")
		p("(`VmRSS`) before they opened and while all were open. RSS counts garbage not yet collected as well as what the")
		p("streams hold: the gateway collects at `GOGC=200` (`pkg/local`), so its figure before may already include up to")
		p("twice its live heap in garbage, which the streams' memory then partly reuses; the table shows both RSS figures.")
		p("The same streams through the bare proxy show what net/http holds for a proxied stream: a server connection")
		p("(buffered reader and writer, the handler's goroutine and the one that watches for the client leaving) and a")
		p("client connection (buffered reader and writer, the transport's read and write goroutines); each of its streams")
		p("also holds the proxy's 4 KiB copy buffer while it waits, where the gateway gives its read buffer back between")
		p("events. On the backend side the gateway holds less: a connection to an http:// backend is a socket and its 2 KiB")
		p("read buffer, read by the handler's goroutine (`pkg/upstream/conns.go`).")
		p("")
		p("| process | streams open | RSS before | RSS with streams | per open stream |")
		p("| --- | --- | --- | --- | --- |")
		mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
		per := func(a, b int64, n int) string {
			if n == 0 {
				return "–"
			}
			return fmt.Sprintf("%.1f KiB", float64(b-a)/float64(n)/1024)
		}
		p("| simulator, called directly | %d | %s | %s | %s |", mm.directOpened, mib(mm.simIdle), mib(mm.simOpen), per(mm.simIdle, mm.simOpen, mm.directOpened))
		p("| gateway | %d | %s | %s | %s |", mm.gatewayOpen, mib(mm.gwIdle), mib(mm.gwOpen), per(mm.gwIdle, mm.gwOpen, mm.gatewayOpen))
		p("| simulator, behind the gateway | %d | %s | %s | %s |", mm.gatewayOpen, mib(mm.simIdleGw), mib(mm.simOpenGw), per(mm.simIdleGw, mm.simOpenGw, mm.gatewayOpen))
		p("| bare proxy | %d | %s | %s | %s |", mm.proxyOpened, mib(mm.proxyIdle), mib(mm.proxyOpen), per(mm.proxyIdle, mm.proxyOpen, mm.proxyOpened))
		if mm.directErr != nil || mm.gatewayErr != nil || mm.proxyErr != nil {
			p("")
			p("Errors opening streams: direct %v; gateway %v; bare proxy %v.", mm.directErr, mm.gatewayErr, mm.proxyErr)
		}
		p("")
		if l := mm.live; l.opened > 0 {
			p("By the runtime's own count, after a collection before the streams opened and another with them open (the same")
			p("gateway with a pprof listener, `tests/bench/cmd/gatewayprof`, on a stack of its own), each of %d open streams", l.opened)
			p("holds %.1f KiB in the gateway: %.1f KiB of heap in use and %.1f KiB of goroutine stacks. This figure has no",
				kib(l.perStream.total()), kib(l.perStream.heapInuse), kib(l.perStream.stack))
			p("garbage in it, which the RSS figure may have more or less of.")
		} else if mm.liveErr != nil {
			p("The live heap and stacks per stream were not measured: %v.", mm.liveErr)
		}
		p("")
	}

	// Cold start.
	if lc := r.Cold.lambda; len(r.Cold.gateway) > 0 || r.Cold.err != nil || len(lc.dynamo.cold) > 0 || len(lc.sqlite.cold) > 0 || lc.err != nil {
		p("## Cold start")
		p("")
		p("From `exec` of the binary to the first 200 answer to a non-streamed chat completion. The local server is polled on")
		p("its port every 0.2 ms; it restarts on the store the run created, and the simulator answers directly. The Lambda")
		p("`bootstrap` (`functions/gateway` built by `infra/lambdabuild` as the release is, for this machine's architecture,")
		p("with the catalog beside it) runs under a loopback Runtime API in the benchmark process with one function URL event")
		p("queued (`events/function-url-request.json` carrying the request); its time runs until the invocation's streamed")
		p("response (prelude with status 200, eight NUL bytes, body) has arrived whole, settlement included. It starts on")
		p("DynamoDB, as on AWS (DynamoDB Local on loopback, tables created and seeded by `kilnctl`), and on the embedded store")
		p("of the run. The first start on each store is not counted: it warms DynamoDB Local's JVM, which on AWS is always")
		p("warm. On the embedded store the usage event is folded into the store's aggregates before the response ends; on")
		p("AWS the usage table's stream carries it, with no call of the gateway's. \"Init\" is until the bootstrap first asked the Runtime API for an")
		p("invocation (what Lambda reports as Init Duration); the same process then gets a second invocation of the same")
		p("event, timed from when it was queued to the end of its response (\"warm\").")
		p("")
		p("| binary | ms to first 200 | of which init | warm invocation, ms |")
		p("| --- | --- | --- | --- |")
		p("| simulator (`tests/bench/cmd/simserver`) | %s | | |", r.Cold.sim.fmt("%.1f"))
		p("| gateway (`functions/gateway`), local server | %s | | |", r.Cold.gateway.fmt("%.1f"))
		p("| gateway Lambda `bootstrap`, DynamoDB store (DynamoDB Local) | %s | %s | %s |", lc.dynamo.cold.fmt("%.1f"), lc.dynamo.init.fmt("%.1f"), lc.dynamo.warm.fmt("%.1f"))
		p("| gateway Lambda `bootstrap`, embedded store | %s | %s | %s |", lc.sqlite.cold.fmt("%.1f"), lc.sqlite.init.fmt("%.1f"), lc.sqlite.warm.fmt("%.1f"))
		for _, err := range []error{r.Cold.err, lc.err} {
			if err != nil {
				p("")
				p("Error: %v", err)
			}
		}
		p("")
	}
	r.reportLambdaCost(p)

	// Go benchmarks.
	if len(r.GoBench) > 0 {
		p("## Go micro-benchmarks")
		p("")
		p("`%s` — medians over the runs, in-process (client, gateway, simulator", r.GoCmd)
		p("and SQLite in one process, so allocations include the client's and the simulator's).")
		p("")
		p("| package | benchmark | ns/op | B/op | allocs/op | other |")
		p("| --- | --- | --- | --- | --- | --- |")
		for _, b := range r.GoBench {
			var other []string
			for _, u := range b.units {
				if u != "ns/op" && u != "B/op" && u != "allocs/op" {
					other = append(other, fmt.Sprintf("%.4g %s", b.values[u].median(), u))
				}
			}
			p("| %s | %s | %s | %.0f | %.0f | %s |", b.pkg, strings.TrimPrefix(b.name, "Benchmark"),
				b.values["ns/op"].fmt("%.4g"), b.values["B/op"].median(), b.values["allocs/op"].median(), strings.Join(other, ", "))
		}
		if g, s := findGoBench(r.GoBench, "BenchmarkChat/gateway"), findGoBench(r.GoBench, "BenchmarkChat/simulator"); g != nil && s != nil {
			p("")
			p("Hot path: the gateway adds %.0f allocations (%.0f B) and %.0f µs per non-streamed request over calling the simulator",
				g.values["allocs/op"].median()-s.values["allocs/op"].median(), g.values["B/op"].median()-s.values["B/op"].median(),
				(g.values["ns/op"].median()-s.values["ns/op"].median())/1000)
			p("in-process (one connection, admission and settlement in SQLite included).")
		}
		allocs, ok1 := relayPerChunk(r.GoBench, "allocs/op")
		size, ok2 := relayPerChunk(r.GoBench, "B/op")
		ns, ok3 := relayPerChunk(r.GoBench, "ns/op")
		if ok1 && ok2 && ok3 {
			p("Per streamed chunk it adds %.2f allocations, %.0f B and %.2f µs: the cost of one more chunk, (%d-token stream −",
				allocs, size, ns/1000, longChunkTokens)
			p("%d-token stream) / %d through the gateway less the same from the simulator, so that what is done once per request",
				shortChunkTokens, longChunkTokens-shortChunkTokens)
			p("is left out. The simulator is sent the body the gateway forwards to it (usage on every chunk).")
		}
		p("")
	}
	// Store latency.
	if sq := findGoBench(r.GoBench, "BenchmarkAdmitSettle"); sq != nil || len(r.Store) > 0 {
		p("## Store: admission and settlement")
		p("")
		p("One `Admit` then one `Settle` at a time, each timed alone; medians over the runs of each quantile, in ms. The")
		p("embedded store is `BenchmarkAdmitSettle` of the Go micro-benchmarks above (SQLite on this machine's disk); the")
		p("DynamoDB store runs `%s` (%d of each per run,", r.StoreCmd, storeBenchOps)
		p("against DynamoDB Local 3.3.0 and moto on loopback, started by the test package; on AWS a call is a network round")
		p("trip to DynamoDB instead). The embedded store is opened as the local gateway opens it (slots in memory, no")
		p("commit window).")
		p("")
		p("A request is settled before its answer ends (before the last byte of a body, before a stream's `data: [DONE]`),")
		p("so that its slot is free and its debit durable when the client sees the end: the **settle** columns are the")
		p("time added to the last byte of every answer.")
		p("")
		p("| store | admit p50 | admit p99 | settle p50 | settle p99 | calls per request |")
		p("| --- | --- | --- | --- | --- | --- |")
		row := func(name string, b *goBench) {
			v := func(unit string) string {
				if s, ok := b.values[unit]; ok {
					return s.fmt("%.3f")
				}
				return ""
			}
			p("| %s | %s | %s | %s | %s | %s |", name, v("admit-p50-ms"), v("admit-p99-ms"), v("settle-p50-ms"), v("settle-p99-ms"), v("calls/op"))
		}
		if sq != nil {
			row("embedded (SQLite)", sq)
		}
		for _, b := range r.Store {
			row("DynamoDB ("+strings.TrimPrefix(b.name, "BenchmarkAdmitSettle/")+")", b)
		}
		p("")
	}
	if len(r.Errors) > 0 {
		p("## Errors during the run")
		p("")
		for _, e := range r.Errors {
			p("- %s", e)
		}
		p("")
	}
}

// gatewayCPUPerChunk is the gateway's CPU per relayed chunk in µs, per round.
func gatewayCPUPerChunk(ps []pair) spread {
	return perRound(ps, func(p pair) float64 { return cpuPer(p.gateway, "gateway", true) })
}

func connections(n int) string {
	if n == 1 {
		return "1 connection"
	}
	return fmt.Sprintf("%d connections", n)
}

// cpuBound explains the 8-connection latency figures by the CPU a request costs: the closed loop
// keeps the cores busy, so that latency is mostly the wait for them.
func cpuBound(p func(string, ...any), ps []pair, cores int) {
	rate := func(of func(pair) phase) float64 {
		return perRound(ps, func(p pair) float64 { return of(p).rate() }).median()
	}
	cpu := func(of func(pair) phase, proc string) float64 {
		return perRound(ps, func(p pair) float64 { return cpuPer(of(p), proc, false) }).median()
	}
	direct := func(p pair) phase { return p.direct }
	xd, xg := rate(direct), rate(ofGateway)
	gw, sim, gen := cpu(ofGateway, "gateway"), cpu(ofGateway, "simulator"), cpu(ofGateway, "loadgen")
	need := 8 / (8/xd + 300e-6)
	p("Why the 8-connection latency targets are a matter of CPU: 8 connections in a closed loop keep the cores busy, so that")
	p("a request mostly waits for a core, and its mean latency is 8 / throughput (Little's law): %.0f µs through the", 8/xg*1e6)
	p("gateway, %.0f µs direct. Per request through the gateway, the gateway, the simulator behind it and the load generator",
		8/xd*1e6)
	p("use %.0f + %.0f + %.0f = %.0f µs of CPU; %d cores serve at most %.0f such requests a second. Adding no more than",
		gw, sim, gen, gw+sim+gen, cores, float64(cores)/(gw+sim+gen)*1e6)
	p("300 µs to the mean latency would take %.0f req/s, at most %.0f µs of CPU per request for the three processes", need, float64(cores)/need*1e6)
	if hasBare(ps) {
		p("together, where the bare proxy alone uses %.0f.", cpu(ofBare, "bareproxy"))
	} else {
		p("together.")
	}
	p("")
}
