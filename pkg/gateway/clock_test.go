package gateway

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// fakeClock is a Clock that moves only when a test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer  // armed, in no order
	armed  chan struct{} // gets a value whenever a timer is armed
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	f  func()
}

func newFakeClock(now time.Time) *fakeClock {
	return &fakeClock{now: now, armed: make(chan struct{}, 1)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{c: c, f: f}
	t.Reset(d)
	return t
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	active := t.stopLocked()
	t.at = c.now.Add(d)
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	select {
	case c.armed <- struct{}{}:
	default:
	}
	return active
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.stopLocked()
}

func (t *fakeTimer) stopLocked() bool {
	i := slices.Index(t.c.timers, t)
	if i < 0 {
		return false
	}
	t.c.timers = slices.Delete(t.c.timers, i, i+1)
	return true
}

// advance moves the clock on by d and runs, each in its own goroutine as time.AfterFunc does,
// the timers that are then due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool {
		if t.at.After(c.now) {
			return false
		}
		due = append(due, t)
		return true
	})
	c.mu.Unlock()
	for _, t := range due {
		go t.f()
	}
}

// soonest returns how far ahead the soonest timer armed within max of now is.
func (c *fakeClock) soonest(max time.Duration) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ahead []time.Duration
	for _, tm := range c.timers {
		if d := tm.at.Sub(c.now); d <= max {
			ahead = append(ahead, d)
		}
	}
	if len(ahead) == 0 {
		return 0, false
	}
	return slices.Min(ahead), true
}

// nextWithin waits until a timer is armed to fire within max from now, and returns how far
// ahead it is.
func (c *fakeClock) nextWithin(t *testing.T, max time.Duration) time.Duration {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if d, ok := c.soonest(max); ok {
			return d
		}
		select {
		case <-c.armed:
		case <-time.After(time.Millisecond):
		case <-deadline:
			t.Fatalf("no timer armed within %v of the fake clock", max)
		}
	}
}

// flakySettle fails the next fails settlements, and counts every try.
type flakySettle struct {
	store.Gateway
	fails atomic.Int64
	tries atomic.Int64
}

func (s *flakySettle) Settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	s.tries.Add(1)
	if s.fails.Add(-1) >= 0 {
		return store.SettleResult{}, errStoreStalled
	}
	return s.Gateway.Settle(ctx, st)
}

// TestSettlementRetriesOnTheGatewaysClock: a settlement that fails is retried with a doubling
// backoff measured on the clock the gateway was given, and given up when the next backoff would
// pass its time limit on that clock; the test drives the clock, and nothing sleeps.
func TestSettlementRetriesOnTheGatewaysClock(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name       string
		settleWait time.Duration
		fails      int64
		backoffs   []time.Duration // armed after failed tries, in order
		tries      []int64         // tries made when each backoff is armed
		status     int             // what the client gets
	}{
		// Four failures, then the fifth try commits: the answer is given.
		{name: "commits after four failures", settleWait: time.Minute, fails: 4,
			backoffs: []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms}, tries: []int64{1, 2, 3, 4}, status: 200},
		// Tries at 0, 50 and 150 ms; the next backoff, 200 ms, would end past the 300 ms the
		// answer may wait: it is withheld, and the settlement retried anew (from a 50 ms
		// backoff) before the handler returns; the fifth try commits.
		{name: "gives up at its limit", settleWait: 300 * ms, fails: 4,
			backoffs: []time.Duration{50 * ms, 100 * ms, 50 * ms}, tries: []int64{1, 2, 4}, status: 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock(time.Now())
			flaky := &flakySettle{}
			flaky.fails.Store(tc.fails)
			h := newHarness(t, config{
				gateway: func(o *Options) {
					o.Clock = clk
					o.SettleWait = tc.settleWait
				},
				wrapStore: func(s store.Gateway) store.Gateway { flaky.Gateway = s; return flaky },
			})
			t.Cleanup(func() {
				// Should the test fail with the handler waiting on the clock, let it finish.
				flaky.fails.Store(0)
				clk.advance(time.Hour)
			})
			key, _ := h.newOrg("org_clock", "1", 8)
			type result struct {
				status int
				genID  string
				err    error
			}
			done := make(chan result, 1)
			go func() {
				r := h.newRequest(context.Background(), req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three", `"max_tokens":4`)})
				resp, err := h.client.Do(r)
				if err != nil {
					done <- result{err: err}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done <- result{status: resp.StatusCode, genID: resp.Header.Get(GenerationHeader)}
			}()
			// The lease's renewal and fence are armed tens of seconds ahead; the backoffs are
			// the timers within a second.
			for i, want := range tc.backoffs {
				d := clk.nextWithin(t, time.Second)
				if d != want {
					t.Fatalf("backoff %d: %v, want %v", i+1, d, want)
				}
				if got := flaky.tries.Load(); got != tc.tries[i] {
					t.Fatalf("tries before backoff %d: %d", i+1, got)
				}
				clk.advance(d)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("no answer after %d tries", flaky.tries.Load())
			}
			if r.err != nil || r.status != tc.status {
				t.Fatalf("answer: %d %v, want %d", r.status, r.err, tc.status)
			}
			if got, want := flaky.tries.Load(), tc.fails+1; got != want {
				t.Errorf("%d settlement tries, want %d", got, want)
			}
			ev := h.waitEvent("org_clock", r.genID)
			if ev.HTTPStatus != tc.status || (tc.status == http.StatusOK) != (ev.Status == "completed") {
				t.Errorf("event %+v", ev)
			}
		})
	}
}

// flakyRenew counts lease renewals and fails them while fail is set.
type flakyRenew struct {
	store.Gateway
	fail  atomic.Bool
	calls atomic.Int64
}

func (s *flakyRenew) Renew(ctx context.Context, l store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	defer s.calls.Add(1)
	if s.fail.Load() {
		return store.Lease{}, errStoreStalled
	}
	return s.Gateway.Renew(ctx, l, now, ttl)
}

// armedAt waits until a timer is armed exactly d ahead of the fake clock.
func (c *fakeClock) armedAt(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		found := slices.ContainsFunc(c.timers, func(tm *fakeTimer) bool { return tm.at.Sub(c.now) == d })
		c.mu.Unlock()
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no timer armed %v ahead of the fake clock", d)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseOnTheGatewaysClock: a stream's lease is renewed every third of its TTL and fenced a
// sixth of it before it expires, as the gateway's clock tells; the test drives the clock through
// a renewal that succeeds and two that fail, and the stream is stopped with slot_lost only once
// the renewed lease comes within the fence, not at the first lease's.
func TestLeaseOnTheGatewaysClock(t *testing.T) {
	t.Parallel()
	clk := newFakeClock(time.Now())
	renew := &flakyRenew{}
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.Clock = clk; o.LeaseTTL = time.Minute },
		wrapStore: func(s store.Gateway) store.Gateway { renew.Gateway = s; return renew },
	})
	key, _ := h.newOrg("org_lease", "1", 1)
	s := h.stream(req{path: "/v1/chat/completions", key: key,
		body: chatBody("gpt-oss-120b", "long [[sim:delay_ms=5]]", `"max_tokens":100000`, `"stream":true`)})
	ended := make(chan []event, 1)
	go func() { ended <- s.all() }()
	const sec = time.Second
	// Renewals every 20 s; the fence at 50 s, 10 s before the first lease expires.
	clk.armedAt(t, 20*sec)
	clk.armedAt(t, 50*sec)
	steps := []struct {
		advance time.Duration
		fail    bool          // renewals fail from this step on
		renews  int64         // renewals made after it
		armed   time.Duration // a timer then armed this far ahead
	}{
		{advance: 20 * sec, renews: 1, armed: 20 * sec},             // t=20: renewed to expire at 80 s
		{advance: 20 * sec, fail: true, renews: 2, armed: 20 * sec}, // t=40: renewal fails
		{advance: 10 * sec, renews: 2, armed: 20 * sec},             // t=50: the fence waits until 70 s
		{advance: 10 * sec, renews: 3, armed: 20 * sec},             // t=60: renewal fails
	}
	for i, st := range steps {
		if st.fail {
			renew.fail.Store(true)
		}
		clk.advance(st.advance)
		clk.armedAt(t, st.armed)
		if got := renew.calls.Load(); got != st.renews {
			t.Fatalf("step %d: %d renewals, want %d", i, got, st.renews)
		}
		select {
		case evs := <-ended:
			t.Fatalf("step %d: the stream ended while its lease was good: %q", i, evs[len(evs)-1].data)
		default:
		}
	}
	clk.advance(10 * sec) // t=70: 10 s before the renewed lease expires
	var evs []event
	select {
	case evs = <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream went on past its fence")
	}
	if last := evs[len(evs)-1]; !strings.Contains(last.data, `"code":"slot_lost"`) {
		t.Fatalf("fenced stream ended with %q", last.data)
	}
	if ev := h.waitEvent("org_lease", s.resp.Header.Get(GenerationHeader)); ev.Status != usage.StatusSlotLost {
		t.Errorf("record of the fenced stream: %+v", ev)
	}
}
