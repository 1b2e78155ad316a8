package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/neocloud/kiln/tests/internal/build"
)

// memStats are the figures of the runtime's MemStats that open streams grow.
type memStats struct{ HeapInuse, Stack float64 }

func (m memStats) Total() float64 { return m.HeapInuse + m.Stack }

// minus returns what each of n streams added from before to m.
func (m memStats) minus(before memStats, n int) memStats {
	return memStats{(m.HeapInuse - before.HeapInuse) / float64(n), (m.Stack - before.Stack) / float64(n)}
}

func kib(b float64) float64 { return b / 1024 }

type liveMemoryResult struct {
	Opened    int
	PerStream memStats // bytes
}

// measureLiveMemory counts what n open streams hold in a gateway by the runtime's own count after
// a collection, which RSS blurs with garbage not yet collected: functions/gateway built with
// -tags pprof, a pprof listener added, which serves the counts, started in front of the run's
// simulator on an embedded store of its own. Its MemStats are read before the streams open and
// while they are open.
func measureLiveMemory(st *stack, n int) (liveMemoryResult, error) {
	pprofAddr, err := freeAddr()
	if err != nil {
		return liveMemoryResult{}, err
	}
	dir, err := os.MkdirTemp(st.dir, "live-")
	if err != nil {
		return liveMemoryResult{}, err
	}
	bins, err := build.In(st.repo, dir, []string{"-trimpath", "-tags=pprof"}, "./functions/gateway")
	if err != nil {
		return liveMemoryResult{}, err
	}
	p, key, err := st.startGateway("gateway (pprof)", bins[0], dir, "KILN_BENCH_PPROF_ADDR="+pprofAddr)
	if err != nil {
		return liveMemoryResult{}, err
	}
	defer p.stop()
	t := st.through(p, key)
	closedLoop(t, nonStreaming, 8, 0, time.Second, watch{}) // as the RSS phase, after a warm-up
	before, err := liveMemory(pprofAddr)
	if err != nil {
		return liveMemoryResult{}, err
	}
	opened, closeAll, err := openStreams(t, n, 30*time.Second)
	defer closeAll()
	if err != nil || opened == 0 {
		return liveMemoryResult{}, fmt.Errorf("%d of %d streams opened: %v", opened, n, err)
	}
	time.Sleep(500 * time.Millisecond)
	with, err := liveMemory(pprofAddr)
	if err != nil {
		return liveMemoryResult{}, err
	}
	return liveMemoryResult{Opened: opened, PerStream: with.minus(before, opened)}, nil
}

// liveMemory is the MemStats at the end of the text heap profile that the pprof listener at
// pprofAddr serves, taken after a collection.
func liveMemory(pprofAddr string) (memStats, error) {
	url := fmt.Sprintf("http://%s/debug/pprof/heap?gc=1&debug=1", pprofAddr)
	resp, err := http.Get(url)
	if err != nil {
		return memStats{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	if err != nil {
		return memStats{}, fmt.Errorf("GET %s: %w", url, err)
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
			return memStats{}, fmt.Errorf("%s: %w", url, err)
		}
	}
	if m.HeapInuse == 0 || m.Stack == 0 {
		return memStats{}, fmt.Errorf("%s: no MemStats", url)
	}
	return m, nil
}
