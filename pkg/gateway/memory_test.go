package gateway

import (
	"bufio"
	"bytes"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// waitingStreamBudget is what an open stream waiting for its backend may keep reachable of
// what the gateway allocated itself (pkg/gateway and pkg/openai), in bytes: the relay's decoder
// with its 2 KiB read buffer; the exchange with its lease, meter and event as admitted; the
// parsed request and its body; the stream's context, timers and response headers; the start of
// a usage chunk. It keeps no chunk buffers, no copy of the last event and no settlement. On
// 2026-12-01 this came to 6.0 KiB (6.9 before the event was built at settlement). net/http's
// own connections, buffers and goroutines are not counted: they are the same in any Go proxy.
const waitingStreamBudget = 6<<10 + 512

// TestWaitingStreamKeepsLittle states what an open stream that waits for its backend's next
// event keeps of the gateway's own: at most waitingStreamBudget. A heap profile taken with every
// allocation sampled names, for each object still reachable, the functions that allocated it;
// an object counts when the innermost of this module's functions among them is in pkg/gateway
// (outside its tests) or pkg/openai.
func TestWaitingStreamKeepsLittle(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	gated := newGatedBackend(t)
	h := newHarness(t, config{extraModels: gated.model()})
	const streams = 50
	key, _ := h.newOrg("org_streams", "10", streams+1)
	open := func() *sse {
		s := h.stream(req{path: "/v1/chat/completions", key: key,
			body: chatBody("gated", "Hello there, how are you today?", `"max_tokens":100`, `"stream":true`, `"stream_options":{"include_usage":true}`)})
		if ev, err := s.next(); err != nil || !strings.HasPrefix(ev.data, "{") {
			t.Fatalf("first event: %+v, %v", ev, err)
		}
		return s
	}
	open() // the caches a first request fills are not a stream's
	before := ownLiveObjects(t)
	for range streams {
		open()
	}
	with := ownLiveObjects(t)
	var total int64
	for site, n := range with {
		with[site] = n - before[site]
		total += with[site]
	}
	if per := total / streams; per > waitingStreamBudget {
		sites := make([]string, 0, len(with))
		for site := range with {
			sites = append(sites, site)
		}
		sort.Slice(sites, func(i, j int) bool { return with[sites[i]] > with[sites[j]] })
		var b strings.Builder
		for _, site := range sites[:min(len(sites), 20)] {
			b.WriteString("\n\t" + strconv.FormatInt(with[site]/streams, 10) + " B\t" + site)
		}
		t.Errorf("a waiting stream keeps %d bytes of the gateway's own, over the budget of %d:%s", per, waitingStreamBudget, b.String())
	}
}

// ownLiveObjects returns the bytes of reachable objects, after a collection, by the innermost
// function of pkg/gateway (not its tests) or pkg/openai that allocated them.
func ownLiveObjects(t *testing.T) map[string]int64 {
	t.Helper()
	// A heap profile is as of the last completed collection; the second publishes the first's.
	runtime.GC()
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	const module = "github.com/neocloud/kiln/"
	bytesBy := map[string]int64{}
	var inuse int64 // of the record being read; -1 once it is attributed
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 2 && fields[2] != "" && fields[2][0] == '[' {
			// "objects: bytes [allocated objects: allocated bytes] @ pcs": a record starts.
			inuse, _ = strconv.ParseInt(fields[1], 10, 64)
			continue
		}
		// "#  pc  function+offset  file:line", innermost first.
		frame := strings.Fields(line)
		if inuse < 0 || len(frame) < 4 || frame[0] != "#" || !strings.HasPrefix(frame[2], module) {
			continue
		}
		fn, _, _ := strings.Cut(frame[2], "+")
		file, _, _ := strings.Cut(frame[len(frame)-1], ":")
		if (strings.HasPrefix(fn, module+"pkg/gateway.") && !strings.HasSuffix(file, "_test.go")) || strings.HasPrefix(fn, module+"pkg/openai.") {
			bytesBy[strings.TrimPrefix(fn, module+"pkg/")] += inuse
		}
		inuse = -1
	}
	return bytesBy
}
