package bench

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/report.md from the fixture")

// TestReportGolden renders fixed, made-up sets of results and compares the markdown with the
// files in testdata, so that a change of the report's template or of the figures it derives
// shows in review as a change of those files (go test ./tests/bench -run Report -update): the
// whole report, the report of a run with -only-rates, and a report whose Lambda and rate phases
// failed.
func TestReportGolden(t *testing.T) {
	m := Machine{NProc: 2, CPU: "Test CPU", Go: "go version go1.26.8 linux/amd64", Kernel: "6.0.0", LoadAvg: "1.00 1.10 1.20"}
	failed := fixtureResults()
	failed.Rates = rateResults{rows: failed.Rates.rows[:1], err: errors.New("rate phases on DynamoDB Local: no java")}
	failed.Baseline.err = errors.New("baseline gateway: exit status 1")
	failed.Cold.Lambda.memory = lambdaMemory{err: errors.New("no cgroup v2 controller")}
	for _, tc := range []struct {
		golden string
		render func(w io.Writer) error
	}{
		{"testdata/report.md", func(w io.Writer) error { return fixtureResults().Report(w, m, "make bench") }},
		{"testdata/rates.md", fixtureResults().ReportRates},
		{"testdata/failed.md", func(w io.Writer) error { return failed.Report(w, m, "make bench") }},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var buf bytes.Buffer
			if err := tc.render(&buf); err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(tc.golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(tc.golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("the report differs from %s (run with -update after checking the change):\n%s", tc.golden, buf.String())
			}
		})
	}
}

// fixtureResults is a run's worth of made-up measurements, drawn from a fixed seed.
func fixtureResults() *Results {
	rnd := rand.New(rand.NewPCG(1, 2))
	lat := func(base time.Duration, n int) latencies {
		l := make(latencies, n)
		for i := range l {
			l[i] = base + time.Duration(rnd.Int64N(int64(base)))
		}
		return l.sorted()
	}
	ph := func(base time.Duration, procs map[string]time.Duration, chunks int64) phase {
		p := phase{ttfb: lat(base/2, 200), total: lat(base, 200), chunks: chunks, elapsed: 2 * time.Second,
			cpu: map[string]time.Duration{}, syscalls: map[string]int64{}}
		for name, per := range procs {
			p.cpu[name] = per * 200
			p.syscalls[name] = 200 * int64(3+len(name))
		}
		return p
	}
	pairs := func(base time.Duration, bare bool, chunks int64) []pair {
		ps := make([]pair, 3)
		for i := range ps {
			ps[i][ofDirect] = ph(base, map[string]time.Duration{"simulator": 40 * time.Microsecond, "loadgen": 50 * time.Microsecond}, chunks)
			ps[i][ofGateway] = ph(base*3, map[string]time.Duration{"gateway": 150 * time.Microsecond, "simulator": 60 * time.Microsecond, "loadgen": 55 * time.Microsecond}, chunks)
			if bare {
				ps[i][ofBare] = ph(base*2, map[string]time.Duration{"bareproxy": 90 * time.Microsecond, "simulator": 55 * time.Microsecond}, chunks)
			}
		}
		return ps
	}
	sp := func(v ...float64) spread { return spread(v) }
	bench := func(pkg, name string, units map[string]spread, order ...string) *goBench {
		return &goBench{Pkg: pkg, Name: name, Values: units, units: order}
	}
	r := &Results{
		Cfg: Config{Repo: "../..", RateRounds: 3, RateFor: 8 * time.Second, Rounds: 3, Duration: 2 * time.Second, Warmup: 300 * time.Millisecond, Conns: []int{1, 8},
			OpenRate: 1000, OpenFor: 2 * time.Second, Streams: 1000, ColdStarts: 5, GoBenchRuns: 3},
		Started:   time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		LoadStart: "0.50 0.60 0.70",
		Closed:    map[int][]pair{1: pairs(150*time.Microsecond, true, 0), 8: pairs(300*time.Microsecond, true, 0)},
		Short:     pairs(time.Millisecond, false, 200*18),
		Long:      map[int][]pair{1: pairs(8*time.Millisecond, false, 200*1002), 8: pairs(24*time.Millisecond, false, 200*1002)},
		Open:      pairs(700*time.Microsecond, true, 0),
		Memory:    memory{Streams: 1000, Rounds: fixtureIdle(), Live: liveMemoryResult{Opened: 1000, PerStream: memStats{24000, 10000}}},
		Cold: cold{Gateway: sp(11, 10.5, 12.8), Sim: sp(3, 2.9, 4.5),
			Lambda: lambdaCold{Dynamo: lambdaTimes{Init: sp(7, 5, 7.5), Cold: sp(39, 33, 55), Warm: sp(24, 12, 33)},
				SQLite: lambdaTimes{Init: sp(7, 6.7, 11), Cold: sp(9.5, 8.8, 14), Warm: sp(2.1, 1.2, 2.5)}}},
		GoBench: []*goBench{
			bench("pkg/openai", "BenchmarkRewriteChunk", map[string]spread{"ns/op": sp(87, 88, 86), "B/op": sp(0, 0, 0), "allocs/op": sp(0, 0, 0), "MB/s": sp(3345, 3300, 3400)}, "ns/op", "MB/s", "B/op", "allocs/op"),
			bench("pkg/gateway", "BenchmarkChat/gateway", map[string]spread{"ns/op": sp(363000, 356000, 389000), "B/op": sp(31801, 31801, 31801), "allocs/op": sp(528, 528, 528)}, "ns/op", "B/op", "allocs/op"),
			bench("pkg/gateway", "BenchmarkChat/simulator", map[string]spread{"ns/op": sp(49000, 48000, 50000), "B/op": sp(10467, 10467, 10467), "allocs/op": sp(143, 143, 143)}, "ns/op", "B/op", "allocs/op"),
			bench("pkg/gateway", "BenchmarkStreamChunk/tokens=1000/gateway", map[string]spread{"ns/op": sp(7.27e6, 6.95e6, 7.39e6), "B/op": sp(1126824, 1126824, 1126824), "allocs/op": sp(12721, 12721, 12721)}, "ns/op", "B/op", "allocs/op"),
			bench("pkg/gateway", "BenchmarkStreamChunk/tokens=1000/simulator", map[string]spread{"ns/op": sp(5.59e6, 5.45e6, 6.9e6), "B/op": sp(1097145, 1097145, 1097145), "allocs/op": sp(12043, 12043, 12043)}, "ns/op", "B/op", "allocs/op"),
			bench("pkg/gateway", "BenchmarkStreamChunk/tokens=16/gateway", map[string]spread{"ns/op": sp(5.8e5, 5.6e5, 6e5), "B/op": sp(55539, 55539, 55539), "allocs/op": sp(730, 730, 730)}, "ns/op", "B/op", "allocs/op"),
			bench("pkg/gateway", "BenchmarkStreamChunk/tokens=16/simulator", map[string]spread{"ns/op": sp(2.08e5, 1.94e5, 2.09e5), "B/op": sp(27121, 27121, 27121), "allocs/op": sp(309, 309, 309)}, "ns/op", "B/op", "allocs/op"),
			bench("pkg/store/sqlite", "BenchmarkAdmitSettle", map[string]spread{"ns/op": sp(105600, 104100, 106700), "B/op": sp(5182, 5182, 5182), "allocs/op": sp(95, 95, 95),
				"admit-p50-ms": sp(0, 0, 0), "admit-p99-ms": sp(0.003, 0.003, 0.004), "settle-p50-ms": sp(0.078, 0.078, 0.08), "settle-p99-ms": sp(0.332, 0.31, 0.388)},
				"ns/op", "B/op", "allocs/op", "admit-p50-ms", "admit-p99-ms", "settle-p50-ms", "settle-p99-ms"),
		},
		GoCmd: "go test -run ^$ -bench . -benchmem -count 3 ./pkg/openai/ ./pkg/gateway/ ./pkg/store/sqlite/",
		Store: []*goBench{bench("pkg/store/dynamo", "BenchmarkAdmitSettle/DynamoDB_Local", map[string]spread{"admit-p50-ms": sp(1.28, 1.256, 2.046), "admit-p99-ms": sp(6.7, 5.9, 12),
			"settle-p50-ms": sp(4.1, 3.96, 6.27), "settle-p99-ms": sp(12, 9.9, 29), "calls/op": sp(2, 2, 2)}, "admit-p50-ms", "admit-p99-ms", "settle-p50-ms", "settle-p99-ms", "calls/op")},
		StoreCmd: "go test -run ^$ -bench ^BenchmarkAdmitSettle$ -benchtime 300x -count 3 ./pkg/store/dynamo/",
		Errors:   []string{"an example error: " + errors.New("connection refused").Error()},
	}
	r.Rates, r.Baseline = fixtureRates(), fixtureBaseline()
	r.Cold.Lambda.memory = fixtureLambdaMemory()
	return r
}

// fixtureIdle is three made-up rounds of the memory phase, the figures per stream a little
// apart in each.
func fixtureIdle() [][3]idle {
	var rounds [][3]idle
	for i := range 3 {
		d := int64(i) << 19
		rounds = append(rounds, [3]idle{
			ofDirect:  {front: held{1000, 12 << 20, 36<<20 + d}},
			ofGateway: {front: held{1000, 14 << 20, 42<<20 + d}, behind: held{1000, 12 << 20, 22<<20 + d}},
			ofBare:    {front: held{1000, 9 << 20, 65<<20 - d}, behind: held{1000, 12 << 20, 22 << 20}},
		})
	}
	return rounds
}

// fixtureRates are made-up rate phases: the rows a run measures, with a baseline beside the
// gateway on the embedded store and the local server on DynamoDB Local.
func fixtureRates() rateResults {
	rnd := rand.New(rand.NewPCG(3, 4))
	phases := func(cpu time.Duration, switches int64, p50 time.Duration) []phase {
		ps := make([]phase, 3)
		for i := range ps {
			total := make(latencies, 160)
			for j := range total {
				total[j] = p50/2 + time.Duration(rnd.Int64N(int64(p50)))
			}
			ps[i] = phase{cpu: map[string]time.Duration{"server": 160 * (cpu + time.Duration(rnd.Int64N(int64(cpu/10))))},
				switches: map[string]int64{"server": 160*switches + rnd.Int64N(160)}, elapsed: 8 * time.Second, total: total.sorted()}
		}
		return ps
	}
	gw, base := server{name: "gateway"}, server{name: "baseline"}
	return rateResults{rows: []*rateRow{
		{what: "none (bare proxy)", rate: lowRate, gateway: server{name: "bare proxy"}, gw: phases(300*time.Microsecond, 12, 400*time.Microsecond)},
		{what: "embedded store", rate: lowRate, target: 1.2, gateway: gw, baseline: &base,
			gw: phases(1100*time.Microsecond, 30, 900*time.Microsecond), base: phases(1600*time.Microsecond, 38, time.Millisecond)},
		{what: "embedded store", rate: 500, gateway: gw, baseline: &base,
			gw: phases(560*time.Microsecond, 9, 700*time.Microsecond), base: phases(580*time.Microsecond, 9, 720*time.Microsecond)},
		{what: "DynamoDB Local, local server", rate: lowRate, gateway: gw, baseline: &base,
			gw: phases(2900*time.Microsecond, 60, 5*time.Millisecond), base: phases(3100*time.Microsecond, 64, 5*time.Millisecond)},
		{what: "DynamoDB Local, Lambda bootstrap", rate: lowRate, target: 1, onAWS: true, gateway: server{name: "bootstrap"},
			gw: phases(2200*time.Microsecond, 45, 6*time.Millisecond)},
	}}
}

// fixtureBaseline is a made-up side-by-side comparison with a baseline gateway.
func fixtureBaseline() baselineResults {
	b := baselineResults{bin: "/tmp/kilnbench-baseline/gateway-1aeecef"}
	ph := func(cpu time.Duration, requests, chunks int64) phase {
		return phase{total: make(latencies, requests), chunks: chunks, elapsed: 2 * time.Second,
			cpu: map[string]time.Duration{"gateway": cpu}}
	}
	for i := range 3 {
		d := time.Duration(i) * 7 * time.Millisecond
		b.closed = append(b.closed, [2]phase{ph(1900*time.Millisecond+d, 3200, 0), ph(1850*time.Millisecond-d, 3100, 0)})
		b.streams = append(b.streams, [2]phase{ph(1200*time.Millisecond+d, 400, 400*1002), ph(1300*time.Millisecond, 390, 390*1002)})
		b.idle = append(b.idle, [2]float64{27.5*1024 + float64(i*100), 51.2 * 1024})
	}
	return b
}

// fixtureLambdaMemory is a made-up comparison of the bootstrap's memory sizes, with the DynamoDB
// units, log output and fold of its warm requests.
func fixtureLambdaMemory() lambdaMemory {
	m := lambdaMemory{controller: "cgroup v2 `cpu.max`", requests: 30, logBytes: 1218, logLines: 2,
		capacity: map[string]opCapacity{"TransactWriteItems": {Calls: 30, Write: 240}, "UpdateItem": {Calls: 30, Write: 30}},
		tables:   map[string]float64{"kilnbench-ledger": 60, "kilnbench-orgs": 90, "kilnbench-usage": 60, "kilnbench-usage/index/by-started": 60},
		fold:     foldCost{records: 287, bodyBytes: 1263, single: 6, batched: 2.08, batchMS: 39}}
	for i := range 3 {
		f := float64(i)
		r := memoryRound{0: memoryStart{cold: 29.6 + f, firstByte: 5.4 + f/2, whole: 13.3 + f}}
		for _, mb := range lambdaMemorySizes {
			slow := 1024 / float64(mb)
			r[mb] = memoryStart{cold: 40 + 12*slow + f, firstByte: 5 + slow/2 + f/3, whole: 14 + slow + f/2, throttled: 0.05 * slow}
		}
		m.rounds = append(m.rounds, r)
	}
	return m
}

// TestRoundAnswered: a side-by-side round in which one phase answered nothing is left out of the
// ratios, and failed requests are reported, so that a phase that failed does not read as cheap.
func TestRoundAnswered(t *testing.T) {
	names := [2]string{"gateway", "baseline"}
	ok := phase{total: latencies{time.Millisecond}}
	failed := phase{errs: 3, firstErr: errors.New("503 store_unavailable")}
	partly := phase{total: latencies{time.Millisecond}, errs: 1, firstErr: errors.New("EOF")}
	for _, tc := range []struct {
		name      string
		closed    [2]phase
		streams   [2]phase
		answered  bool
		wantError string
	}{
		{"all answered", [2]phase{ok, ok}, [2]phase{ok, ok}, true, ""},
		{"the baseline answered nothing", [2]phase{ok, failed}, [2]phase{ok, ok}, false, "baseline, round 2: 3 of 3 requests failed, the first: 503 store_unavailable"},
		{"a stream failed", [2]phase{ok, ok}, [2]phase{partly, ok}, true, "gateway, round 2: 1 of 2 requests failed, the first: EOF"},
	} {
		answered, err := roundAnswered(1, names, tc.closed, tc.streams)
		if answered != tc.answered {
			t.Errorf("%s: answered %v, want %v", tc.name, answered, tc.answered)
		}
		if got := fmt.Sprint(err); (tc.wantError == "" && err != nil) || (tc.wantError != "" && got != tc.wantError) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantError)
		}
	}
}
