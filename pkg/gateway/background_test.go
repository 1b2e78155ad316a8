package gateway

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// drain is the gateway's Drain, for at most within.
func (h *harness) drain(within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return h.gw.Drain(ctx)
}

// slowSettle delays every settlement, to show that the client's answer does not wait for it: by
// delay, or by what toggled holds (nanoseconds) when it is set.
type slowSettle struct {
	store.Gateway
	delay   time.Duration
	toggled *atomic.Int64
}

func (s *slowSettle) Settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	d := s.delay
	if s.toggled != nil {
		d = time.Duration(s.toggled.Load())
	}
	time.Sleep(d)
	return s.Gateway.Settle(ctx, st)
}

// TestSettleInBackground: with SettleInBackground the handler returns before settlement, so a
// keep-alive connection's next request is not held up by the store; Drain waits for every
// settlement, and each is complete and exact.
func TestSettleInBackground(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.SettleInBackground = true },
		wrapStore: func(s store.Gateway) store.Gateway { return &slowSettle{Gateway: s, delay: delay} },
	})
	key, _ := h.newOrg("org_bg", "1", 8)
	start := time.Now()
	var ids []string
	for i := range 3 {
		r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`), key: key})
		if r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
		ids = append(ids, r.genID())
	}
	if elapsed := time.Since(start); elapsed > 2*delay {
		t.Fatalf("3 requests on one connection took %v: they waited for settlement", elapsed)
	}
	if err := h.drain(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		// The first two handlers had returned, and handed over their settlements, before the
		// connection read the next request. The last one's may have returned just after the
		// client had its answer and Drain had begun.
		if i == len(ids)-1 {
			h.waitEvent("org_bg", id)
		}
		ev, err := h.store.Generation(context.Background(), "org_bg", id)
		if err != nil || ev.Cost.String() != "0.000001155" {
			t.Errorf("%s after Drain: %v, cost %s", id, err, ev.Cost)
		}
	}
	if got := h.balance("org_bg").String(); got != "0.999996535" {
		t.Errorf("balance %s, want 1 − 3 × 0.000001155", got)
	}
}

// TestSettlerReused: a settlement that ends while a settler is idle goes to that settler, which
// settles it as a new one would.
func TestSettlerReused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{gateway: func(o *Options) { o.SettleInBackground = true }})
	key, _ := h.newOrg("org_reuse", "1", 8)
	for i := range 5 {
		r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`), key: key})
		if r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
		// Settled (the response ends before end hands the settlement over), then the
		// settler's work is done.
		h.waitEvent("org_reuse", r.genID())
		if err := h.drain(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Drain returns once the count is down, a moment before the settler waits again: the
	// next settlement may find it busy and start another.
	if n := h.gw.settlers.started.Load(); n < 1 || n > 3 {
		t.Errorf("%d settlers started for 5 settlements one after another, want 1 or a few", n)
	}
	if got := h.balance("org_reuse").String(); got != "0.999994225" {
		t.Errorf("balance %s, want 1 − 5 × 0.000001155", got)
	}
}

// TestDrainWaitsForOpenRequests: Drain waits for a request whose handler still runs, not only for
// settlements already handed to the background, so that a server whose Shutdown timed out does
// not close its store under a stream it has just cut.
func TestDrainWaitsForOpenRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{gateway: func(o *Options) { o.SettleInBackground = true }})
	key, _ := h.newOrg("org_open", "1", 8)
	s := h.stream(req{path: "/v1/chat/completions", key: key,
		body: chatBody("qwen3-32b", "slow [[sim:delay_ms=100]]", `"max_tokens":5`, `"stream":true`)})
	if err := h.drain(150 * time.Millisecond); err == nil {
		t.Fatal("Drain returned while a stream was open")
	}
	s.all()
	if err := h.drain(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Generation(context.Background(), "org_open", s.resp.Header.Get(GenerationHeader)); err != nil {
		t.Errorf("after Drain: %v", err)
	}
}

// burstHarness is a gateway that settles in the background on a store whose settlements take
// delay, with an organization whose key it returns.
func burstHarness(t *testing.T, org string, delay *atomic.Int64) (*harness, string) {
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.SettleInBackground = true },
		wrapStore: func(s store.Gateway) store.Gateway { return &slowSettle{Gateway: s, toggled: delay} },
	})
	key, _ := h.newOrg(org, "1", 16)
	return h, key
}

// slowBurst sends eight requests at once, whose settlements take 200 ms each, and waits until all
// are settled.
func slowBurst(t *testing.T, h *harness, delay *atomic.Int64, key, body string) {
	t.Helper()
	delay.Store(int64(200 * time.Millisecond))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if r := h.do(req{path: "/v1/chat/completions", body: body, key: key}); r.status != 200 {
				t.Errorf("burst: %d", r.status)
			}
		})
	}
	wg.Wait()
	if err := h.drain(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := h.gw.settlers.started.Load(); n < 8 {
		t.Fatalf("%d settlers started for a burst of 8 slow settlements", n)
	}
}

// TestSettlersShrinkAfterABurst: settlers started by a burst exit once steady work no longer needs
// them, although it keeps coming more often than they time out. Not parallel: it keeps a core
// busy for a second, which tests of timing, such as TestLeaseRenewal, should not share.
func TestSettlersShrinkAfterABurst(t *testing.T) {
	delay := new(atomic.Int64)
	h, key := burstHarness(t, "org_burst", delay)
	h.gw.settlers.idleFor = 300 * time.Millisecond
	body := chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`)

	// A burst: eight slow settlements at once need eight settlers.
	slowBurst(t, h, delay, key, body)
	if n := h.gw.settlers.live.Load(); n < 8 {
		t.Fatalf("%d settlers after a burst of 8 slow settlements", n)
	}

	// Then quick settlements, one after another, for three idle periods: each of the eight
	// would get one well within 300 ms if they took turns.
	delay.Store(0)
	for end := time.Now().Add(3 * h.gw.settlers.idleFor); time.Now().Before(end); {
		r := h.do(req{path: "/v1/chat/completions", body: body, key: key})
		if r.status != 200 {
			t.Fatalf("steady: %d", r.status)
		}
		h.waitEvent("org_burst", r.genID())
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.gw.settlers.live.Load(); n > 3 {
		t.Errorf("%d settlers still running for one settlement at a time", n)
	}
}

// TestIdleSettlersAreBounded: of the settlers a burst started, no more than maxIdle wait for work
// afterwards.
func TestIdleSettlersAreBounded(t *testing.T) {
	delay := new(atomic.Int64)
	h, key := burstHarness(t, "org_idle", delay)
	h.gw.settlers.maxIdle = 3
	slowBurst(t, h, delay, key, chatBody("gpt-oss-120b", "one two three", `"max_tokens":4`))
	for end := time.Now().Add(5 * time.Second); h.gw.settlers.live.Load() > 3; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d settlers still live, want at most 3 idle", h.gw.settlers.live.Load())
		}
	}
}

// flakySettle fails the first n settlements, as a store that blinks would.
type flakySettle struct {
	store.Gateway
	fails *atomic.Int64
}

func (s flakySettle) Settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	if s.fails.Add(-1) >= 0 {
		return store.SettleResult{}, errors.New("store unreachable")
	}
	return s.Gateway.Settle(ctx, st)
}

// TestSettlementRetried: a settlement that fails while the store is unreachable is retried until
// it lands; the request is billed once and its slot released.
func TestSettlementRetried(t *testing.T) {
	t.Parallel()
	fails := new(atomic.Int64)
	h := newHarness(t, config{wrapStore: func(s store.Gateway) store.Gateway { return flakySettle{s, fails} }})
	key, _ := h.newOrg("org_flaky", "1", 1)
	fails.Store(3)
	r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`), key: key})
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	ev := h.waitEvent("org_flaky", r.genID())
	if ev.Cost.String() != "0.000001155" || fails.Load() >= 0 {
		t.Fatalf("cost %s after %d failures left", ev.Cost, fails.Load())
	}
	h.waitIdle("org_flaky")
	if got := h.balance("org_flaky").String(); got != "0.999998845" {
		t.Errorf("balance %s, want exactly one debit", got)
	}
}

// TestGenerationRightAfterTheResponse: GET /v1/generation answers from the moment the response
// ended, even while its settlement is still running; another organization still gets 404.
func TestGenerationRightAfterTheResponse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.SettleInBackground = true },
		wrapStore: func(s store.Gateway) store.Gateway { return &slowSettle{Gateway: s, delay: 300 * time.Millisecond} },
	})
	key, _ := h.newOrg("org_fast", "1", 8)
	otherKey, _ := h.newOrg("org_other", "1", 8)
	r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`), key: key})
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	other := h.do(req{method: "GET", path: "/v1/generation?id=" + r.genID(), key: otherKey})
	if other.status != 404 {
		t.Errorf("another organization: %d, want 404", other.status)
	}
	g := h.do(req{method: "GET", path: "/v1/generation?id=" + r.genID(), key: key})
	if g.status != 200 || !strings.Contains(string(g.body), `"cost":"0.000001155"`) {
		t.Fatalf("right after the response: %d %s", g.status, g.body)
	}
}
