// Command kilnbench measures the gateway against the model simulator called directly, in the same
// run, and writes the markdown table of BENCHMARKS.md (`make bench`).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/neocloud/kiln/tests/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kilnbench:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := bench.Config{Log: os.Stderr}
	var conns, out, command string
	flag.StringVar(&cfg.GatewayBin, "gateway", "", "a built gateway binary; empty builds ./functions/gateway")
	flag.IntVar(&cfg.Rounds, "rounds", 5, "rounds of every comparison")
	flag.DurationVar(&cfg.Duration, "duration", 2*time.Second, "measured window of one closed-loop phase")
	flag.DurationVar(&cfg.Warmup, "warmup", 300*time.Millisecond, "warm-up before each closed-loop window")
	flag.StringVar(&conns, "conns", "1,8,64", "closed-loop connection counts")
	flag.Float64Var(&cfg.OpenRate, "rate", 1000, "open-loop requests per second; 0 skips the open loop")
	flag.DurationVar(&cfg.OpenFor, "open-for", 2*time.Second, "one open-loop phase")
	flag.IntVar(&cfg.Streams, "streams", 1000, "concurrent slow streams for the memory figure")
	flag.IntVar(&cfg.ColdStarts, "cold-starts", 5, "cold-start rounds")
	flag.IntVar(&cfg.GoBenchRuns, "go-bench-count", 3, "-count of the Go micro-benchmarks; 0 skips them")
	flag.DurationVar(&cfg.RateFor, "rate-for", 8*time.Second, "one phase at 20 req/s (half that at 500 req/s) of the CPU-per-request figures; 0 skips them")
	flag.IntVar(&cfg.RateRounds, "rate-rounds", 3, "rounds of the CPU-per-request phases at 20 and 500 req/s")
	flag.BoolVar(&cfg.OnlyRates, "only-rates", false, "measure only the CPU-per-request phases at 20 and 500 req/s and, with -baseline-gateway, the side-by-side comparison")
	flag.StringVar(&cfg.BaselineBin, "baseline-gateway", "", "a second gateway binary (another commit's) measured beside -gateway in the same rounds: CPU per request at 8 connections, at 500 and 20 req/s, per streamed chunk, RSS per idle stream")
	flag.StringVar(&out, "out", "", "also write the report to this file (BENCHMARKS.md)")
	flag.StringVar(&command, "command", "", "the command to print as having produced the report; default: this one")
	flag.Parse()

	for _, s := range strings.Split(conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-conns: bad count %q", s)
		}
		cfg.Conns = append(cfg.Conns, n)
	}
	repo, err := findRepo()
	if err != nil {
		return err
	}
	cfg.Repo = repo
	if command == "" {
		command = "go run ./tests/bench/cmd/kilnbench " + strings.Join(os.Args[1:], " ")
	}
	started := time.Now()
	res, err := bench.Run(cfg)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if cfg.OnlyRates {
		err = res.ReportRates(&buf)
	} else {
		err = res.Report(&buf, bench.ThisMachine(), command)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(&buf, "The whole run took %v.\n", time.Since(started).Round(time.Second))
	if _, err := os.Stdout.Write(buf.Bytes()); err != nil || out == "" {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// findRepo is the directory holding the main module's go.mod, as the go command finds it.
func findRepo() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("no go.mod above the working directory (go env GOMOD: %v)", err)
	}
	return filepath.Dir(mod), nil
}
