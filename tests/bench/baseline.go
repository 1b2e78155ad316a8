package bench

import (
	"fmt"
	"path/filepath"
	"time"
)

// baselineResults compare, round by round, the gateway with a second gateway binary (another
// commit's, Config.BaselineBin) on the same simulator, each on an embedded store of its own: the
// figures a change must not make worse by more than a given share (issue 18: 15 %).
type baselineResults struct {
	bin     string
	closed  [][2]phase // non-streamed, 8 connections: gateway, baseline
	streams [][2]phase // 1,000-token streams, 8 connections
	idle    [][2]float64
	err     error
}

// compareBaseline measures the gateway's binary and the baseline binary in cfg.Rounds rounds whose
// order alternates: CPU per non-streamed request at 8 connections, CPU per streamed chunk, and
// RSS per idle open stream (cfg.Streams slow streams, through fresh processes of each binary).
// Each binary runs in a process of its own started for the comparison, on a store of its own,
// warmed up alike: not the run's gateway, whose process and store have carried every phase before
// while the baseline's were new.
func compareBaseline(cfg Config, st *stack, logf func(string, ...any)) baselineResults {
	res := baselineResults{bin: cfg.BaselineBin}
	names, bins := [2]string{"gateway", "baseline"}, [2]string{st.gwBin, cfg.BaselineBin}
	var targets [2]target
	var pids [2]int
	for i, bin := range bins {
		p, key, err := st.startGateway(names[i]+" gateway", bin, filepath.Join(st.dir, names[i]+"-compare"))
		if err != nil {
			res.err = err
			return res
		}
		defer p.stop()
		targets[i], pids[i] = st.through(p, key), p.pid()
		closedLoop(targets[i], nonStreaming, 8, 0, time.Second, watch{}) // warm up
	}

	for r := range cfg.Rounds {
		var closed, streams [2]phase
		var idle [2]float64
		for _, i := range alternate(r, []int{0, 1}) {
			w := watch{"gateway": pids[i]}
			closed[i] = closedLoop(targets[i], nonStreaming, 8, cfg.Warmup, cfg.Duration, w)
			streams[i] = closedLoop(targets[i], longStream, 8, cfg.Warmup, cfg.Duration, w)
			got, err := st.idleFresh(ofGateway, bins[i], cfg.Streams)
			if err != nil {
				res.err = fmt.Errorf("%s, round %d: %w", names[i], r+1, err)
			}
			idle[i] = got.front.perStream()
		}
		for i, name := range names {
			logf("compare round %d: %s %.1f µs CPU per request at 8 connections, %.2f µs per chunk, %.1f KiB per idle stream",
				r+1, name, cpuPer(closed[i], "gateway", false), cpuPer(streams[i], "gateway", true), idle[i]/1024)
		}
		answered, err := roundAnswered(r, names, closed, streams)
		if err != nil {
			res.err = err
		}
		if !answered { // a ratio of nothing would read as 0 µs: the round is left out, its error says why
			continue
		}
		res.closed, res.streams, res.idle = append(res.closed, closed), append(res.streams, streams), append(res.idle, idle)
	}
	return res
}

// roundAnswered reports whether every phase of round r answered at least one request, and an
// error naming the last phase in which requests failed: CPU per request divides by the requests
// answered, so a phase that failed reads cheap.
func roundAnswered(r int, names [2]string, closed, streams [2]phase) (bool, error) {
	answered, err := true, error(nil)
	for i, name := range names {
		for _, ph := range []phase{closed[i], streams[i]} {
			if ph.errs > 0 {
				err = fmt.Errorf("%s, round %d: %d of %d requests failed, the first: %v", name, r+1, ph.errs, ph.errs+int64(len(ph.total)), ph.firstErr)
			}
			answered = answered && len(ph.total) > 0
		}
	}
	return answered, err
}
