package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/upstream"
)

// TestSettlement runs a mixed batch of requests concurrently and checks that each admitted one
// was settled exactly once: one event per generation id, the balance equal to the credits minus
// the events' costs to the picodollar, one debit per paid event, and no slot left held.
func TestSettlement(t *testing.T) {
	t.Parallel()
	// The batch's 500s would open gpt-oss's breaker; TestBreakerOnServerErrors covers that.
	h := newHarness(t, config{upstream: func(o *upstream.Options) { o.FailureThreshold = 1000 }})
	key, _ := h.newOrg("org_batch", "3", 64)
	initial := h.balance("org_batch")

	type kind struct {
		path, body string
		stream     bool
		leave      int // stream: leave after this many events
		status     int
		evStatus   string
	}
	kinds := []kind{
		{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "b1 [[sim:tokens=7]] [[sim:cached=1]]"), status: 200, evStatus: "completed"},
		{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "b2", `"max_tokens":9`), status: 200, evStatus: "completed"},
		{path: "/v1/completions", body: `{"model":"gpt-oss-120b","prompt":"b3 x y","max_tokens":5}`, status: 200, evStatus: "completed"},
		{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "b4 [[sim:tokens=6]]", `"stream":true`, `"stream_options":{"include_usage":true}`), stream: true, status: 200, evStatus: "completed"},
		{path: "/v1/completions", body: `{"model":"gpt-oss-120b","prompt":"b5","max_tokens":4,"stream":true}`, stream: true, status: 200, evStatus: "completed"},
		{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "b6 [[sim:drop_after=2]]", `"stream":true`), stream: true, status: 200, evStatus: "upstream_error"},
		{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "b7 [[sim:delay_ms=20]]", `"max_tokens":100`, `"stream":true`), stream: true, leave: 4, status: 200, evStatus: "client_disconnected"},
		{path: "/v1/chat/completions", body: `{"model":"qwen3-32b","messages":[]}`, status: 400, evStatus: "rejected"},
		{path: "/v1/completions", body: `{"model":"not-a-model","prompt":"x"}`, status: 404, evStatus: "rejected"},
		{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "b10 [[sim:status=400]]"), status: 400, evStatus: "rejected"},
		{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "b11 [[sim:status=500]]"), status: 502, evStatus: "upstream_error"},
	}
	const rounds = 3
	type result struct {
		k     kind
		genID string
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	for range rounds {
		for _, k := range kinds {
			wg.Go(func() {
				var genID string
				if k.stream {
					s := h.stream(req{path: k.path, body: k.body, key: key})
					genID = s.resp.Header.Get(GenerationHeader)
					if s.resp.StatusCode != k.status {
						t.Errorf("%s: status %d", k.body, s.resp.StatusCode)
					}
					if k.leave > 0 {
						for range k.leave {
							if _, err := s.next(); err != nil {
								t.Errorf("%s: %v", k.body, err)
								break
							}
						}
						s.close()
					} else {
						s.all()
					}
				} else {
					r := h.do(req{path: k.path, body: k.body, key: key})
					genID = r.genID()
					if r.status != k.status {
						t.Errorf("%s: status %d, want %d: %s", k.body, r.status, k.status, r.body)
					}
				}
				mu.Lock()
				results = append(results, result{k, genID})
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	h.waitIdle("org_batch")

	var (
		total money.Amount
		paid  = map[string]money.Amount{}
	)
	seen := map[string]bool{}
	for _, res := range results {
		if seen[res.genID] || !genIDPattern.MatchString(res.genID) {
			t.Fatalf("generation id %q repeated or malformed", res.genID)
		}
		seen[res.genID] = true
		ev := h.waitEvent("org_batch", res.genID)
		if string(ev.Status) != res.k.evStatus {
			t.Errorf("%s: event status %s, want %s", res.k.body, ev.Status, res.k.evStatus)
		}
		switch ev.Status {
		case "rejected":
			if ev.Cost != 0 || ev.PromptTokens != 0 || ev.CompletionTokens != 0 || ev.HTTPStatus != res.k.status {
				t.Errorf("rejected event %+v", ev)
			}
		case "completed", "client_disconnected":
			if ev.Cost <= 0 {
				t.Errorf("%s: free event %+v", res.k.body, ev)
			}
		}
		if want := h.mustCost(modelOf(t, ev.Model), ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens); ev.Model != "not-a-model" && ev.Cost != want {
			t.Errorf("%s: cost %s, want %s for its tokens", res.k.body, ev.Cost, want)
		}
		total += ev.Cost
		if ev.Cost != 0 {
			paid[ev.GenerationID] = ev.Cost
		}
	}
	if evs := h.events("org_batch"); len(evs) != len(results) {
		t.Errorf("%d events recorded for %d requests", len(evs), len(results))
	}
	if got := h.balance("org_batch"); got != initial-total {
		t.Errorf("balance %s, want %s - %s = %s", got, initial, total, initial-total)
	}
	ledger, err := h.store.Ledger(context.Background(), "org_batch")
	if err != nil {
		t.Fatal(err)
	}
	debits := 0
	for _, e := range ledger {
		if e.Kind != store.EntryDebit {
			continue
		}
		debits++
		if paid[e.ID] != -e.Amount {
			t.Errorf("debit %s of %s, event cost %s", e.ID, e.Amount, paid[e.ID])
		}
	}
	if debits != len(paid) {
		t.Errorf("%d debits for %d paid events", debits, len(paid))
	}
	if leases, _ := h.store.InFlight(context.Background(), "org_batch", time.Now()); len(leases) != 0 {
		t.Errorf("%d leases still held", len(leases))
	}
}

func modelOf(t *testing.T, id string) string {
	if id == "not-a-model" {
		return "qwen3-32b" // unused: a rejected event costs nothing
	}
	return id
}

// renewCounter counts lease renewals; the renewals from the heldFrom-th on wait for held to be
// closed before they reach the store, so that settlement meets one in flight.
type renewCounter struct {
	store.Gateway
	n        atomic.Int64
	heldFrom int64
	held     chan struct{}
}

func (s *renewCounter) Renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	if s.n.Add(1) >= s.heldFrom {
		<-s.held
	}
	return s.Gateway.Renew(ctx, lease, now, ttl)
}

// TestLeaseRenewal checks that a stream longer than the lease keeps its slot, and that renewals
// stop when the request is settled. The gateway runs on a fake clock, which the test moves on
// through more than two lease lifetimes while a backend holds the stream open, so that neither
// the machine's load nor the scheduler can make a renewal late.
func TestLeaseRenewal(t *testing.T) {
	t.Parallel()
	const ttl, every = time.Minute, 20 * time.Second // renewed every third of the lease
	clk := newFakeClock(time.Now())
	const renewals = 7 // while the stream runs: 140 s, past two lifetimes of the first lease
	rc := &renewCounter{heldFrom: renewals + 1, held: make(chan struct{})}
	t.Cleanup(func() { close(rc.held) })
	gated := newGatedBackend(t)
	h := newHarness(t,
		config{gateway: func(o *Options) { o.Clock = clk; o.LeaseTTL = ttl }},
		config{wrapStore: func(s store.Gateway) store.Gateway { rc.Gateway = s; return rc }},
		config{extraModels: gated.model()},
	)
	key, _ := h.newOrg("org_one", "1", 1)

	s := h.stream(req{path: "/v1/chat/completions", key: key,
		body: chatBody("gated", "long", `"max_tokens":10`, `"stream":true`)})
	if s.resp.StatusCode != 200 {
		t.Fatalf("stream: %d", s.resp.StatusCode)
	}
	clk.armedAt(t, every)
	// Each renewal has been made, and the next one armed, before the clock moves again.
	for i := range renewals {
		clk.advance(every)
		clk.armedAt(t, every)
		if n := rc.n.Load(); n != int64(i+1) {
			t.Fatalf("%d renewals after %v", n, time.Duration(i+1)*every)
		}
	}
	if r := h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("qwen3-32b", "second")}); r.status != 429 {
		t.Errorf("second request while the first still streams: %d %s", r.status, r.body)
	}
	// One more renewal is held in flight while the stream ends and is settled.
	clk.advance(every)
	for deadline := time.Now().Add(10 * time.Second); rc.n.Load() <= renewals; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no renewal after the clock passed its time")
		}
	}
	gated.release()
	if evs := dataEvents(s.all()); len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("the long stream did not end complete: %v", evs)
	}
	h.waitIdle("org_one")
	rc.held <- struct{}{} // the held renewal goes on, to find its request settled

	for i := range 10 {
		// The slot is released when settlement ends, a moment after the client read the end.
		h.waitIdle("org_one")
		r := h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("qwen3-32b", "short [[sim:delay_ms=10]]", `"max_tokens":6`)})
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	h.waitIdle("org_one")
	// Settlement stops a request's renewals and fence: nothing is left armed on the clock, so
	// moving it on renews nothing.
	if d, armed := clk.soonest(time.Duration(1<<63 - 1)); armed {
		t.Errorf("a timer still armed %v ahead after every request was settled", d)
	}
	settled := rc.n.Load()
	clk.advance(2 * every)
	if n := rc.n.Load(); n != settled {
		t.Errorf("%d renewals after every request was settled", n-settled)
	}
}
