package upstream

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
)

// waitingStreamBudget is what a waiting stream may keep of what was allocated under pkg/upstream:
// 3,222 bytes measured (Go 1.26), 3,260 before the connection gate and the request id, which the
// per-request context and the wait channel paid for.
const waitingStreamBudget = 3400

// TestWaitingStreamKeepsLittle: what a stream that waits for its next event keeps, by the
// innermost function of pkg/upstream under which it was allocated (net/http's allocations
// included, as the Transport keeps them for the stream; not the connection's buffers, which the
// Transport's dialing goroutine allocates), stays under waitingStreamBudget.
func TestWaitingStreamKeepsLittle(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	release := make(chan struct{})
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	p, m, _ := onePool(t, srv.URL+"/v1")
	open := func() *Response {
		// A context that can be cancelled, as a server's request context is: the Transport's
		// own context registers with it.
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		resp, err := p.Do(ctx, Call{Model: m, Path: "/chat/completions", Body: func(catalog.Backend) []byte { return bytes.Repeat([]byte("x"), 300) }, OrgID: "org_a"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	open().Body.Close()
	const streams = 20
	var keep []*Response
	before := upstreamLiveObjects(t)
	for range streams {
		keep = append(keep, open())
	}
	with := upstreamLiveObjects(t)
	var total int64
	for site, n := range with {
		with[site] = n - before[site]
		total += with[site]
	}
	sites := make([]string, 0, len(with))
	for site := range with {
		sites = append(sites, site)
	}
	sort.Slice(sites, func(i, j int) bool { return with[sites[i]] > with[sites[j]] })
	var b strings.Builder
	for _, site := range sites[:min(len(sites), 20)] {
		b.WriteString("\n\t" + strconv.FormatInt(with[site]/streams, 10) + " B\t" + site)
	}
	if per := total / streams; per > waitingStreamBudget {
		t.Errorf("a waiting stream keeps %d bytes allocated under pkg/upstream, over the budget of %d:%s", per, waitingStreamBudget, b.String())
	}
	runtime.KeepAlive(keep)
	for _, r := range keep {
		r.Body.Close()
	}
}

// upstreamLiveObjects returns the bytes of reachable objects, after a collection, by the allocating
// function and the innermost function of pkg/upstream (not its tests) under it.
func upstreamLiveObjects(t *testing.T) map[string]int64 {
	t.Helper()
	// A heap profile is as of the last completed collection; the second publishes the first's.
	runtime.GC()
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	const pkg = "github.com/neocloud/kiln/pkg/upstream."
	bytesBy := map[string]int64{}
	var inuse int64  // of the record being read; -1 once it is attributed
	var first string // the record's allocating function
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 2 && fields[2] != "" && fields[2][0] == '[' {
			inuse, _ = strconv.ParseInt(fields[1], 10, 64)
			first = ""
			continue
		}
		frame := strings.Fields(line)
		if inuse < 0 || len(frame) < 4 || frame[0] != "#" {
			continue
		}
		if first == "" {
			first, _, _ = strings.Cut(frame[2], "+")
		}
		if !strings.HasPrefix(frame[2], pkg) || strings.Contains(frame[len(frame)-1], "_test.go") {
			continue
		}
		fn, _, _ := strings.Cut(frame[2], "+")
		bytesBy[fmt.Sprintf("%s <- %s", strings.TrimPrefix(first, "net/http."), strings.TrimPrefix(fn, pkg))] += inuse
		inuse = -1
	}
	return bytesBy
}
