package gateway

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
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
