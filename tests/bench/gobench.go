package bench

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// goBench is one Go benchmark's figures, each unit's values over -count runs.
type goBench struct {
	Pkg, Name string
	Values    map[string]spread // unit ("ns/op", "allocs/op", ...) → one value per run
	units     []string          // in the order go test prints them
}

// Other is the medians of the units besides time, bytes and allocations, for the report.
func (b *goBench) Other() string {
	var other []string
	for _, u := range b.units {
		if u != "ns/op" && u != "B/op" && u != "allocs/op" {
			other = append(other, fmt.Sprintf("%.4g %s", b.Values[u].median(), u))
		}
	}
	return strings.Join(other, ", ")
}

// goBenchPackages are the hot paths' micro-benchmarks.
var goBenchPackages = []string{"./pkg/openai/", "./pkg/gateway/", "./pkg/store/sqlite/"}

// runGoBench runs the packages' benchmarks with -benchmem and parses go test's output.
func runGoBench(repo string, count int, log *os.File) ([]*goBench, string, error) {
	return goTestBench(repo, log, append([]string{"-bench", ".", "-benchmem", "-count", strconv.Itoa(count)}, goBenchPackages...)...)
}

// storeBenchOps is how many admissions and settlements the DynamoDB store's benchmark times on
// each server (DynamoDB Local, moto), a few milliseconds each.
const storeBenchOps = 300

// runStoreBench times admission and settlement on the DynamoDB store against DynamoDB Local and
// moto, which its test package starts itself (BenchmarkAdmitSettle reports p50 and p99 of each).
func runStoreBench(repo string, count int, log *os.File) ([]*goBench, string, error) {
	return goTestBench(repo, log, "-bench", "^BenchmarkAdmitSettle$", "-benchtime", fmt.Sprintf("%dx", storeBenchOps), "-count", strconv.Itoa(count), "./pkg/store/dynamo/")
}

// goTestBench runs go test -run ^$ with args, which run benchmarks, and parses its output.
func goTestBench(repo string, log *os.File, args ...string) ([]*goBench, string, error) {
	args = append([]string{"test", "-run", "^$"}, args...)
	command := "go " + strings.Join(args, " ")
	fmt.Fprintf(log, "running %s\n", command)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, command, fmt.Errorf("%s: %v\n%s", command, err, out)
	}
	var list []*goBench
	byName := map[string]*goBench{}
	pkg := ""
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(strings.TrimSpace(rest), "github.com/neocloud/kiln/")
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			name = name[:i] // drop -GOMAXPROCS
		}
		b := byName[pkg+name]
		if b == nil {
			b = &goBench{Pkg: pkg, Name: name, Values: map[string]spread{}}
			byName[pkg+name] = b
			list = append(list, b)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			unit := f[i+1]
			if _, seen := b.Values[unit]; !seen {
				b.units = append(b.units, unit)
			}
			b.Values[unit] = append(b.Values[unit], v)
		}
	}
	return list, command, nil
}

func findGoBench(list []*goBench, name string) *goBench {
	if i := slices.IndexFunc(list, func(b *goBench) bool { return b.Name == name }); i >= 0 {
		return list[i]
	}
	return nil
}

// BenchmarkStreamChunk's two stream lengths (pkg/gateway/bench_test.go).
const longChunkTokens, shortChunkTokens = 1000, 16

// overhead is what the gateway adds over the simulator in a Go benchmark: allocations, bytes and µs.
type overhead struct{ Allocs, Bytes, Micros float64 }

// relayPerChunk is what the gateway adds per relayed chunk in BenchmarkStreamChunk: the cost of
// one more chunk — (the 1,000-token stream's − the 16-token stream's) / 984, which leaves out the
// work done once per request — through the gateway, less the same from the simulator alone; nil
// when a benchmark or a unit is missing.
func relayPerChunk(list []*goBench) *overhead {
	perChunk := func(target, unit string) (float64, bool) {
		long := findGoBench(list, fmt.Sprintf("BenchmarkStreamChunk/tokens=%d/%s", longChunkTokens, target))
		short := findGoBench(list, fmt.Sprintf("BenchmarkStreamChunk/tokens=%d/%s", shortChunkTokens, target))
		if long == nil || short == nil || len(long.Values[unit]) == 0 || len(short.Values[unit]) == 0 {
			return 0, false
		}
		return (long.Values[unit].median() - short.Values[unit].median()) / (longChunkTokens - shortChunkTokens), true
	}
	var a [3]float64
	for i, unit := range []string{"allocs/op", "B/op", "ns/op"} {
		g, gok := perChunk("gateway", unit)
		s, sok := perChunk("simulator", unit)
		if !gok || !sok {
			return nil
		}
		a[i] = g - s
	}
	return &overhead{a[0], a[1], a[2] / 1000}
}
