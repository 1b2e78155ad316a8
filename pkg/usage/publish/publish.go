// Package publish moves settled usage events from the store's outbox to the bus, off the
// client's critical path, and never loses one.
//
// Settlement records every event unpublished (store.Outbox). Off Lambda, the gateway hands each
// settled event to Enqueue, which never blocks: a bounded queue feeds a few workers that send
// batches of up to ten and mark what the bus acknowledged. On Lambda, PublishNow does the same
// synchronously after the response has ended, before the handler returns (the process may be
// frozen afterwards). Whatever is not acknowledged — a full queue, a failing bus, a crash — stays
// unpublished in the store, and Sweep, run periodically, publishes it again. A redelivered event
// is harmless: the aggregation is idempotent by generation id.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// sender is the bus: EventBridge (pkg/usage/eventbridge) or the in-process fold (InProcess).
// It returns the events the bus acknowledged.
type sender interface {
	Publish(ctx context.Context, events []usage.Event) ([]usage.Event, error)
}

// outbox is the part of the store that publishing needs.
type outbox interface {
	Unpublished(ctx context.Context, before time.Time, limit int) ([]usage.Event, error)
	MarkPublished(ctx context.Context, refs []store.EventRef) error
}

// Defaults of Options.
const (
	DefaultQueueSize  = 4096
	DefaultWorkers    = 2
	DefaultSweepEvery = time.Minute
	batchSize         = 10  // PutEvents' limit
	sweepPage         = 100 // events read from the outbox at a time
	sweepMaxPages     = 100 // a sweep stops after this many pages, and goes on at the next tick
)

// Options wire a Publisher. Sender and Outbox are required.
type Options struct {
	Sender sender
	Outbox outbox
	Log    *slog.Logger // nil discards
	// QueueSize bounds the events waiting for a worker; an event that finds the queue full is
	// left to the sweep. Zero means DefaultQueueSize.
	QueueSize int
	Workers   int // zero means DefaultWorkers
	// SweepEvery is how often Run sweeps, and how old an unpublished event must be before the
	// sweep sends it again (younger ones are probably still in the queue). Zero means
	// DefaultSweepEvery.
	SweepEvery time.Duration
	Now        func() time.Time
}

// Publisher publishes settled events and sweeps the outbox.
type Publisher struct {
	opt   Options
	log   *slog.Logger
	queue chan usage.Event
	sweep sync.Mutex // one sweep at a time
}

// New returns a Publisher; call Run to start its workers (Enqueue) and its periodic sweep.
func New(opt Options) (*Publisher, error) {
	if opt.Sender == nil || opt.Outbox == nil {
		return nil, errors.New("publish: Sender and Outbox are required")
	}
	if opt.QueueSize <= 0 {
		opt.QueueSize = DefaultQueueSize
	}
	if opt.Workers <= 0 {
		opt.Workers = DefaultWorkers
	}
	if opt.SweepEvery <= 0 {
		opt.SweepEvery = DefaultSweepEvery
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{opt: opt, log: log, queue: make(chan usage.Event, opt.QueueSize)}, nil
}

// Enqueue hands a settled event to the workers without ever blocking; when the queue is full the
// event stays unpublished in the store, for the sweep. It is gateway.Options.Publish off Lambda.
func (p *Publisher) Enqueue(ctx context.Context, e usage.Event) {
	select {
	case p.queue <- e:
	default:
		p.log.LogAttrs(ctx, slog.LevelWarn, "usage queue full; the sweep will publish the event",
			slog.String("generation_id", e.GenerationID), slog.String("org_id", e.OrgID))
	}
}

// PublishNow publishes one event and marks it published before it returns. It is
// gateway.Options.Publish on Lambda, where nothing may run after the handler returns. Failures
// are logged; the event stays unpublished for the sweep.
func (p *Publisher) PublishNow(ctx context.Context, e usage.Event) {
	p.send(ctx, []usage.Event{e})
}

// send publishes events and marks the acknowledged ones; it reports how many were marked.
func (p *Publisher) send(ctx context.Context, events []usage.Event) (int, error) {
	acked, err := p.opt.Sender.Publish(ctx, events)
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "usage events not published; the sweep will try again",
			slog.Int("events", len(events)), slog.Int("acknowledged", len(acked)), slog.String("error", err.Error()))
	}
	if len(acked) == 0 {
		return 0, err
	}
	refs := make([]store.EventRef, len(acked))
	for i, e := range acked {
		refs[i] = store.EventRef{OrgID: e.OrgID, GenerationID: e.GenerationID}
	}
	if merr := p.opt.Outbox.MarkPublished(ctx, refs); merr != nil {
		// The bus has them; the sweep will send them again, which the aggregation ignores.
		p.log.LogAttrs(ctx, slog.LevelWarn, "published usage events not marked; they will be sent again",
			slog.Int("events", len(refs)), slog.String("error", merr.Error()))
		return 0, errors.Join(err, merr)
	}
	return len(acked), err
}

// Run runs the workers and the periodic sweep until ctx ends. Then it publishes what is still
// queued, for at most drain, and returns; what it could not publish stays in the outbox.
func (p *Publisher) Run(ctx context.Context, drain time.Duration) {
	var wg sync.WaitGroup
	for range p.opt.Workers {
		wg.Go(func() { p.work(ctx) })
	}
	wg.Go(func() {
		t := time.NewTicker(p.opt.SweepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := p.Sweep(ctx); err != nil && ctx.Err() == nil {
					p.log.LogAttrs(ctx, slog.LevelWarn, "usage sweep incomplete", slog.String("error", err.Error()))
				}
			}
		}
	})
	wg.Wait()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	for dctx.Err() == nil {
		batch := p.take(dctx, false)
		if len(batch) == 0 {
			return
		}
		p.send(dctx, batch)
	}
}

func (p *Publisher) work(ctx context.Context) {
	for {
		batch := p.take(ctx, true)
		if len(batch) == 0 {
			return // ctx ended
		}
		// The events were settled; sending them must not stop half-way because the process
		// is shutting down (Run drains the rest with its own deadline).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		p.send(sctx, batch)
		cancel()
	}
}

// take returns up to batchSize queued events: it waits for the first one when wait is set
// (until ctx ends), then takes what is already there.
func (p *Publisher) take(ctx context.Context, wait bool) []usage.Event {
	var batch []usage.Event
	if wait {
		select {
		case e := <-p.queue:
			batch = append(batch, e)
		case <-ctx.Done():
			return nil
		}
	}
	for len(batch) < batchSize {
		select {
		case e := <-p.queue:
			batch = append(batch, e)
		default:
			return batch
		}
	}
	return batch
}

// Sweep publishes the events that have been unpublished for longer than SweepEvery, oldest
// first, until none is left, the bus stops acknowledging, or sweepMaxPages pages are done. It
// returns how many it published.
func (p *Publisher) Sweep(ctx context.Context) (int, error) {
	p.sweep.Lock()
	defer p.sweep.Unlock()
	before := p.opt.Now().Add(-p.opt.SweepEvery)
	total := 0
	for range sweepMaxPages {
		events, err := p.opt.Outbox.Unpublished(ctx, before, sweepPage)
		if err != nil {
			return total, fmt.Errorf("sweep: %w", err)
		}
		if len(events) == 0 {
			return total, nil
		}
		n, err := p.send(ctx, events)
		total += n
		if err != nil || n == 0 {
			return total, fmt.Errorf("sweep: %d of %d events published: %w", n, len(events), err)
		}
		if len(events) < sweepPage {
			break
		}
	}
	if total > 0 {
		p.log.LogAttrs(ctx, slog.LevelInfo, "usage sweep republished events", slog.Int("events", total))
	}
	return total, nil
}

// recorder is what the in-process bus delivers to: usage.Aggregator.
type recorder interface {
	Record(ctx context.Context, e usage.Event) error
}

// InProcess is the bus of a gateway without EventBridge (make run): publishing an event folds it
// into the aggregates directly, through the same idempotent fold the aggregator function runs.
type InProcess struct {
	Recorder recorder
}

// Publish folds each event; an event is acknowledged once folded.
func (b InProcess) Publish(ctx context.Context, events []usage.Event) ([]usage.Event, error) {
	var (
		acked []usage.Event
		errs  []error
	)
	for _, e := range events {
		if err := b.Recorder.Record(ctx, e); err != nil {
			errs = append(errs, err)
			continue
		}
		acked = append(acked, e)
	}
	return acked, errors.Join(errs...)
}
