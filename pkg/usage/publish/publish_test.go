package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/usage"
)

// switchBus acknowledges everything while up, nothing while down.
type switchBus struct {
	mu   sync.Mutex
	down bool
	got  []string
}

func (b *switchBus) Publish(_ context.Context, events []usage.Event) ([]usage.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(events) > sweepPage {
		return nil, fmt.Errorf("batch of %d", len(events))
	}
	if b.down {
		return nil, errors.New("bus down")
	}
	for _, e := range events {
		b.got = append(b.got, e.GenerationID)
	}
	return events, nil
}

func (b *switchBus) set(down bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = down
}

func (b *switchBus) ids() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Sorted(slices.Values(b.got))
}

// settleN settles n events on a fresh embedded store, as the gateway does.
func settleN(t *testing.T, st *sqlite.Store, n int, now time.Time) []usage.Event {
	t.Helper()
	ctx := t.Context()
	if err := st.CreateOrg(ctx, store.Org{ID: "org", Name: "Org", Status: store.OrgActive, MaxInFlight: 8, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	var out []usage.Event
	for i := range n {
		e := usage.Event{Version: 1, GenerationID: fmt.Sprintf("gen-%03d", i), OrgID: "org", KeyID: "kiln-x",
			Endpoint: "/v1/chat/completions", Status: usage.StatusRejected, HTTPStatus: 400, StartedAt: now}
		if _, err := st.Settle(ctx, store.Settlement{Event: e, Now: now}); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestNothingLost: with the bus down and a queue too small, Enqueue never blocks and nothing is
// published; once the bus is back, one sweep publishes every event, and the outbox is empty.
func TestNothingLost(t *testing.T) {
	st, err := sqlite.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	events := settleN(t, st, 250, t0)
	bus := &switchBus{down: true}
	now := t0
	p, err := New(Options{Sender: bus, Outbox: st, QueueSize: 5, SweepEvery: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		p.Enqueue(t.Context(), e) // no worker runs: 5 queued, the rest dropped
	}
	for batch := p.take(t.Context(), false); len(batch) > 0; batch = p.take(t.Context(), false) {
		p.send(t.Context(), batch) // what a worker does, while the bus is down
	}
	p.PublishNow(t.Context(), events[0])
	now = t0.Add(2 * time.Minute)
	if n, err := p.Sweep(t.Context()); n != 0 || err == nil {
		t.Errorf("Sweep with the bus down = %d, %v; want 0 and an error", n, err)
	}
	bus.set(false)
	if n, err := p.Sweep(t.Context()); n != len(events) || err != nil {
		t.Errorf("Sweep = %d, %v; want %d", n, err, len(events))
	}
	left, err := st.Unpublished(t.Context(), now.Add(time.Hour), 10)
	if err != nil || len(left) != 0 {
		t.Errorf("Unpublished after the sweep = %d, %v", len(left), err)
	}
	if got := bus.ids(); len(got) != len(events) {
		t.Errorf("bus got %d events, want %d", len(got), len(events))
	}
}

// TestRunPublishesQueued: the workers publish what is enqueued and mark it, and Run drains the
// queue when stopped.
func TestRunPublishesQueued(t *testing.T) {
	st, err := sqlite.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now()
	events := settleN(t, st, 40, t0)
	bus := &switchBus{}
	p, err := New(Options{Sender: bus, Outbox: st, SweepEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx, 5*time.Second) }()
	for _, e := range events {
		p.Enqueue(t.Context(), e)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(bus.ids()) < len(events) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if got := bus.ids(); len(got) != len(events) {
		t.Errorf("published %d of %d", len(got), len(events))
	}
	left, err := st.Unpublished(t.Context(), t0.Add(time.Hour), 100)
	if err != nil || len(left) != 0 {
		t.Errorf("Unpublished = %d, %v; want none", len(left), err)
	}
}
