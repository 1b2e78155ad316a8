package bench

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Profile runs the gateway built with a pprof listener (functions/gateway with -tags pprof) under the loads that
// matter, non-streaming at 8 connections, 1,000-token streams, and non-streaming at 20 req/s on
// each store (only those with cfg.OnlyRates), and saves a CPU profile of each in dir, then a
// heap profile (also as text, which ends with the runtime's MemStats, stacks included) and a
// goroutine dump with cfg.Streams slow streams open; `go tool pprof -top` of each profile goes to
// cfg.Log.
func Profile(cfg Config, dir string, seconds int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	st, pprofAddr, err := setUpPprof(cfg)
	if err != nil {
		return err
	}
	defer st.close()
	w := watch{"gateway": st.gw.pid(), "simulator": st.sim.pid()}
	closedLoop(st.gateway, nonStreaming, 8, 0, time.Second, w) // warm up
	d := time.Duration(seconds) * time.Second
	if !cfg.OnlyRates {
		for _, run := range []struct {
			name  string
			kind  requestKind
			conns int
		}{
			{"nonstreaming-8conns", nonStreaming, 8},
			{"stream1000-1conn", longStream, 1},
			{"stream1000-8conns", longStream, 8},
		} {
			err := profiled(cfg, pprofAddr, filepath.Join(dir, run.name), seconds, func() string {
				ph := closedLoop(st.gateway, run.kind, run.conns, 200*time.Millisecond, d+time.Second, w)
				return fmt.Sprintf("%s: %d requests, p50 %v, p99 %v, %.0f/s; gateway CPU %v", run.name, len(ph.total), ph.total.q(.5), ph.total.q(.99), ph.rate(), ph.cpu["gateway"])
			})
			if err != nil {
				return err
			}
		}
	}
	if err := profileLowRate(cfg, st, dir, pprofAddr, seconds); err != nil || cfg.OnlyRates {
		return err
	}
	// The memory of open streams: a heap profile while cfg.Streams slow streams are open, and the
	// runtime's count of live heap and stacks, each after a collection, before and with them.
	live, err := liveStreams(st, pprofAddr, cfg.Streams, dir, func() error {
		path := filepath.Join(dir, "heap-open-streams.pprof")
		if err := fetch(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", pprofAddr), path); err != nil {
			return err
		}
		rssOpen, _ := rss(st.gw.pid())
		fmt.Fprintf(cfg.Log, "== %d open streams: gateway RSS %.1f MiB; heap profile %s\n", cfg.Streams, float64(rssOpen)/(1<<20), path)
		pprofTop(cfg, path, "-sample_index=inuse_space", "-nodecount=25")
		return fetch(fmt.Sprintf("http://%s/debug/pprof/goroutine?debug=1", pprofAddr), filepath.Join(dir, "goroutines-open-streams.txt"))
	})
	if err == nil {
		per := live.PerStream
		fmt.Fprintf(cfg.Log, "== live heap and stacks per open stream, after a collection: %.1f KiB (heap in use %.1f, stacks %.1f)\n",
			kib(per.Total()), kib(per.HeapInuse), kib(per.Stack))
	}
	return err
}

// profiled saves a CPU profile and an allocation profile (for the garbage collector's share)
// of the gateway at pprofAddr, seconds long, in path.pprof and path-allocs.pprof while load
// runs, and writes load's summary and the profile's top functions to cfg.Log.
func profiled(cfg Config, pprofAddr, path string, seconds int, load func() string) error {
	got := make(chan error, 2)
	for kind, file := range map[string]string{"profile": path + ".pprof", "allocs": path + "-allocs.pprof"} {
		go func() {
			got <- fetch(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", pprofAddr, kind, seconds), file)
		}()
	}
	summary := load()
	if err := errors.Join(<-got, <-got); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Log, "== %s; profile %s.pprof\n", summary, path)
	pprofTop(cfg, path+".pprof", "-nodecount=45")
	pprofTop(cfg, path+".pprof", "-cum", "-nodecount=45")
	return nil
}

// setUpPprof is setUp with the gateway built with a pprof listener, and that listener's address.
func setUpPprof(cfg Config) (*stack, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	st, err := setUp(cfg, "pprof", []string{"KILN_BENCH_PPROF_ADDR=" + addr})
	return st, addr, err
}

// pprofTop writes `go tool pprof -top` of the profile at path, with args, to cfg.Log.
func pprofTop(cfg Config, path string, args ...string) {
	top := exec.Command("go", append(append([]string{"tool", "pprof", "-top"}, args...), path)...)
	top.Dir = cfg.Repo
	top.Stdout, top.Stderr = cfg.Log, cfg.Log
	_ = top.Run()
}

// fetch saves what url answers in path.
func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// memStats are the figures of the runtime's MemStats that open streams grow.
type memStats struct{ HeapInuse, Stack float64 }

func (m memStats) Total() float64 { return m.HeapInuse + m.Stack }

// minus returns what each of n streams added from before to m.
func (m memStats) minus(before memStats, n int) memStats {
	return memStats{(m.HeapInuse - before.HeapInuse) / float64(n), (m.Stack - before.Stack) / float64(n)}
}

func kib(b float64) float64 { return b / 1024 }

// measureLiveMemory counts, on a stack of its own, what n open streams hold in the gateway by the
// runtime's own count after a collection, which RSS blurs with garbage not yet collected. The
// gateway there is functions/gateway built with -tags pprof, a pprof listener added, which serves the
// counts.
func measureLiveMemory(cfg Config, n int) (liveMemoryResult, error) {
	st, pprofAddr, err := setUpPprof(cfg)
	if err != nil {
		return liveMemoryResult{}, err
	}
	defer st.close()
	closedLoop(st.gateway, nonStreaming, 8, 0, time.Second, watch{}) // as the RSS phase, after a warm-up
	return liveStreams(st, pprofAddr, n, st.dir, func() error { return nil })
}

// liveStreams reads the gateway's MemStats from the text heap profile (saved in dir) after a
// collection, before n slow streams open and while they are open, and returns what each stream
// added; meanwhile, with the streams open, it calls during.
func liveStreams(st *stack, pprofAddr string, n int, dir string, during func() error) (liveMemoryResult, error) {
	before, err := liveMemory(pprofAddr, filepath.Join(dir, "heap-before-streams.txt"))
	if err != nil {
		return liveMemoryResult{}, err
	}
	opened, closeAll, err := openStreams(st.gateway, n, 30*time.Second)
	defer closeAll()
	if err != nil || opened == 0 {
		return liveMemoryResult{}, fmt.Errorf("%d of %d streams opened: %v", opened, n, err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := during(); err != nil {
		return liveMemoryResult{}, err
	}
	with, err := liveMemory(pprofAddr, filepath.Join(dir, "heap-open-streams.txt"))
	if err != nil {
		return liveMemoryResult{}, err
	}
	return liveMemoryResult{Opened: opened, PerStream: with.minus(before, opened)}, nil
}

type liveMemoryResult struct {
	Opened    int
	PerStream memStats // bytes
}

// liveMemory saves the text heap profile, taken after a collection, in path and returns the
// MemStats at its end.
func liveMemory(pprofAddr, path string) (memStats, error) {
	if err := fetch(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1&debug=1", pprofAddr), path); err != nil {
		return memStats{}, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return memStats{}, err
	}
	var m memStats
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			m.HeapInuse, err = strconv.ParseFloat(strings.TrimSpace(v), 64)
		} else if v, ok := strings.CutPrefix(line, "# Stack = "); ok {
			inuse, _, _ := strings.Cut(v, " ")
			m.Stack, err = strconv.ParseFloat(inuse, 64)
		}
		if err != nil {
			return memStats{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	if m.HeapInuse == 0 || m.Stack == 0 {
		return memStats{}, fmt.Errorf("%s: no MemStats", path)
	}
	return m, nil
}

// profileLowRate saves CPU profiles of the gateway serving non-streamed requests at lowRate, on
// the embedded store of st and on DynamoDB Local: where a request's fixed costs go when nothing
// amortises them.
func profileLowRate(cfg Config, st *stack, dir, pprofAddr string, seconds int) error {
	ddb, storeEnv, key, err := onDynamoDBLocal(st, "kilnprof-")
	if ddb != nil {
		defer ddb.Stop()
	}
	if err != nil {
		return err
	}
	dynamoPprof, err := freeAddr()
	if err != nil {
		return err
	}
	env := append(append(slices.Clone(st.env), storeEnv...), "KILN_BENCH_PPROF_ADDR="+dynamoPprof)
	gw, err := start("gateway on DynamoDB Local", st.gwBin, nil, env, filepath.Join(st.dir, "gateway-dynamodb.log"))
	if err != nil {
		return err
	}
	defer gw.stop()
	for _, run := range []struct {
		name      string
		pprofAddr string
		gw        *proc
		key       string
	}{
		{"nonstreaming-20rps-sqlite", pprofAddr, st.gw, st.key},
		{"nonstreaming-20rps-dynamodb", dynamoPprof, gw, key},
	} {
		s := st.server(run.name, run.gw, run.key)
		rateLoop(s, lowRate, 2*time.Second) // warm up
		err := profiled(cfg, run.pprofAddr, filepath.Join(dir, run.name), seconds, func() string {
			ph := rateLoop(s, lowRate, time.Duration(seconds)*time.Second)
			return fmt.Sprintf("%s: %d requests, %d errors, p50 %v; gateway CPU %.3f ms per request", run.name, len(ph.total), ph.errs, ph.total.q(.5), ph.cpuPerRequest())
		})
		if err != nil {
			return err
		}
	}
	return nil
}
