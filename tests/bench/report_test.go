package bench

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/report.md from the fixture")

// TestReportGolden renders a fixed, made-up set of results and compares the markdown with
// testdata/report.md, so that a change of the report's template or of the figures it derives
// shows in review as a change of that file (go test ./tests/bench -run Report -update).
func TestReportGolden(t *testing.T) {
	var buf bytes.Buffer
	m := Machine{NProc: 2, CPU: "Test CPU", Go: "go version go1.26.8 linux/amd64", Kernel: "6.0.0", LoadAvg: "1.00 1.10 1.20"}
	if err := fixtureResults().Report(&buf, m, "make bench"); err != nil {
		t.Fatal(err)
	}
	const golden = "testdata/report.md"
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("the report differs from %s (run with -update after checking the change):\n%s", golden, buf.String())
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
			ps[i].direct = ph(base, map[string]time.Duration{"simulator": 40 * time.Microsecond, "loadgen": 50 * time.Microsecond}, chunks)
			ps[i].gateway = ph(base*3, map[string]time.Duration{"gateway": 150 * time.Microsecond, "simulator": 60 * time.Microsecond, "loadgen": 55 * time.Microsecond}, chunks)
			if bare {
				ps[i].bare = ph(base*2, map[string]time.Duration{"bareproxy": 90 * time.Microsecond, "simulator": 55 * time.Microsecond}, chunks)
			}
		}
		return ps
	}
	sp := func(v ...float64) spread { return spread(v) }
	bench := func(pkg, name string, units map[string]spread, order ...string) *goBench {
		return &goBench{pkg: pkg, name: name, values: units, units: order}
	}
	return &Results{
		Cfg: Config{Rounds: 3, Duration: 2 * time.Second, Warmup: 300 * time.Millisecond, Conns: []int{1, 8},
			OpenRate: 1000, OpenFor: 2 * time.Second, Streams: 1000, ColdStarts: 5, GoBenchRuns: 3},
		Started:   time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		LoadStart: "0.50 0.60 0.70",
		Closed:    map[int][]pair{1: pairs(150*time.Microsecond, true, 0), 8: pairs(300*time.Microsecond, true, 0)},
		Short:     pairs(time.Millisecond, false, 200*18),
		Long:      map[int][]pair{1: pairs(8*time.Millisecond, false, 200*1002), 8: pairs(24*time.Millisecond, false, 200*1002)},
		Open:      pairs(700*time.Microsecond, true, 0),
		Memory: memory{streams: 1000, directOpened: 1000, gatewayOpen: 1000, simIdle: 12 << 20, simOpen: 36 << 20,
			gwIdle: 33 << 20, gwOpen: 65 << 20, simIdleGw: 36 << 20, simOpenGw: 46 << 20, proxyOpened: 1000,
			proxyIdle: 12 << 20, proxyOpen: 68 << 20, live: liveMemoryResult{opened: 1000, perStream: memStats{24000, 10000}}},
		Cold: cold{gateway: sp(11, 10.5, 12.8), sim: sp(3, 2.9, 4.5),
			lambda: lambdaCold{dynamo: lambdaTimes{init: sp(7, 5, 7.5), cold: sp(39, 33, 55), warm: sp(24, 12, 33)},
				sqlite: lambdaTimes{init: sp(7, 6.7, 11), cold: sp(9.5, 8.8, 14), warm: sp(2.1, 1.2, 2.5)}}},
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
}
