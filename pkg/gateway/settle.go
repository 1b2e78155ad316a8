package gateway

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// outcome is what settling an exchange came to: conclude makes it once, end reads it.
type outcome struct {
	st        store.Settlement // what conclude settled, or end retries
	committed bool             // the settlement committed
	withheld  bool             // the answer was not given for want of its settlement (withhold)
	result    store.SettleResult
}

// conclude settles the exchange before the client can see the end of its answer: in the
// settlement's one store write the slot and its reservation are released, the cost debited once
// and the usage event recorded. A client that sends its next request when this one ended then
// never finds this one still in flight, and no answer is complete before its debit is durable.
//
// It waits for the store at most SettleWait (on Lambda, until shortly before the deadline) and
// reports whether the settlement committed; when not, end retries it. conclude runs once; later
// calls report the first outcome.
func (x *exchange) conclude() bool {
	if x.outcome != nil {
		return x.outcome.committed
	}
	g := x.g
	o := &outcome{st: x.settlement()}
	x.outcome = o
	res, err := g.settleRetrying(x.reqCtx, o.st, g.opt.Clock.Now().Add(g.opt.SettleWait))
	if err != nil {
		g.log.LogAttrs(x.reqCtx, slog.LevelWarn, "settlement not committed before the answer's end; retrying",
			slog.String("generation_id", x.admitted.GenerationID), slog.String("org_id", x.admitted.OrgID), slog.String("error", err.Error()))
		return false
	}
	o.committed, o.result = true, res
	return true
}

// withhold records that the answer was not given: its settlement did not commit in time, and an
// answer is never complete without its debit. The client gets errStoreDown's 503 instead (the
// caller returns it) and the request is billed nothing; its settlement is retried as such.
func (x *exchange) withhold() {
	x.outcome.withheld = true
	ev := &x.outcome.st.Event
	ev.Status = usage.StatusRejected
	ev.HTTPStatus = errStoreDown.status
	ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens = 0, 0, 0
	ev.Cost, ev.Estimated = 0, false
}

// settlement stops the lease's renewal and fence and builds the request's usage event: the event
// as admitted, what the steps decided, and what the meter measured.
func (x *exchange) settlement() store.Settlement {
	g := x.g
	lease := x.slot.stop()
	now := g.opt.Clock.Now()
	ev := *x.admitted
	ev.Status, ev.HTTPStatus, ev.Backend, ev.TTFTMillis = x.event.Status, x.event.HTTPStatus, x.event.Backend, x.event.TTFTMillis
	if x.req != nil {
		if err := x.meter.apply(&ev, x.req.model.Pricing); err != nil {
			g.log.LogAttrs(x.reqCtx, slog.LevelError, "cost not computable", slog.String("generation_id", ev.GenerationID), slog.String("error", err.Error()))
		}
	}
	ev.DurationMillis = max(now.Sub(ev.StartedAt).Milliseconds(), ev.TTFTMillis)
	if ev.Cost > lease.Reserved {
		// The reservation is the request's proven worst case; a backend that reports more is
		// billed up to it, the usage marked estimated (and the store would cap it too).
		g.log.LogAttrs(x.reqCtx, slog.LevelError, "cost above the request's reservation; capped",
			slog.String("generation_id", ev.GenerationID), slog.String("cost", ev.Cost.String()), slog.String("reserved", lease.Reserved.String()))
		ev.Cost, ev.Estimated = lease.Reserved, true
	}
	return store.Settlement{Lease: lease, Event: ev, Now: now}
}

// end finishes the exchange once its handler is done with it: a request that ended without a
// final write of the gateway (a client that left) is settled now; one whose settlement did not
// commit before its answer ended is retried — in the background off Lambda, on this goroutine on
// Lambda, which may freeze the process once the handler returns. Then the request's log line and
// metrics are written.
func (x *exchange) end() {
	g := x.g
	x.conclude()
	o := x.outcome
	if o.committed {
		g.finish(o.st.Event, o.result, nil)
		return
	}
	retry := func() {
		res, err := g.settleRetrying(x.reqCtx, o.st, g.opt.Clock.Now().Add(g.opt.SettleRetryFor))
		if err == nil && res.AlreadyApplied && o.withheld {
			// The try that conclude gave up on did commit (its answer was lost, not the write):
			// the record bills an answer the client never got. Nothing can undo that here
			// without a second debit path; the line names it for a refund.
			g.log.LogAttrs(context.Background(), slog.LevelError, "withheld answer was billed by an earlier try of its settlement; refund it",
				slog.String("generation_id", o.st.Event.GenerationID), slog.String("org_id", o.st.Event.OrgID))
		}
		g.finish(o.st.Event, res, err)
	}
	if !g.opt.SettleInBackground {
		retry()
		return
	}
	g.unsettledLate.Add(1)
	go func() {
		defer g.unsettledLate.Add(-1)
		retry()
	}()
}

// finish logs a settled request and writes its metrics; with err, the settlement was abandoned.
// Its usage event needs no publishing: the usage record the settlement wrote is the event, and
// the usage table's stream carries it to the aggregator.
//
// The request's log line holds what an operator looks for in the log (the generation id, the
// organization, model, backend, status and durations); tokens, cost and the rest are in the usage
// record, which GET /v1/generation, kilnctl and finance read. With metrics, their line carries
// the same fields (Metrics.Request) and is the request's only line: CloudWatch Logs bills every
// byte (docs/deploy.md, "What the stack costs per million requests").
func (g *Gateway) finish(e usage.Event, res store.SettleResult, err error) {
	ctx := context.Background()
	defer g.settled(e.GenerationID)
	if err != nil {
		// What the log line holds is all there is left of this request's bill: it carries every
		// field of the event, so that it can be replayed into the store by hand.
		g.log.LogAttrs(ctx, slog.LevelError, "settlement abandoned", append(eventAttrs(e), slog.String("error", err.Error()))...)
		return
	}
	if res.WrittenOff > 0 {
		// The store capped the debit at what the organization had: the event holds the debited
		// cost, and this is what could not be billed.
		e.Cost -= res.WrittenOff
		e.Estimated = true
		g.log.LogAttrs(ctx, slog.LevelWarn, "debit capped at the available balance",
			append(eventAttrs(e), slog.String("written_off", res.WrittenOff.String()))...)
	}
	if h := g.log.Handler(); (g.opt.Metrics == nil || res.AlreadyApplied) && h.Enabled(ctx, slog.LevelInfo) {
		// The record is the one Logger.LogAttrs would make, without the caller's PC: finding it
		// walks the stack (2.4k instructions of the line's 15k), and no handler of ours has
		// AddSource to print it.
		r := slog.NewRecord(time.Now(), slog.LevelInfo, "request", 0)
		r.AddAttrs(slog.String("generation_id", e.GenerationID), slog.String("org_id", e.OrgID),
			slog.String("model", e.Model), slog.String("backend", e.Backend),
			slog.String("status", string(e.Status)), slog.Int("http_status", e.HTTPStatus),
			slog.Int64("ttft_ms", e.TTFTMillis), slog.Int64("duration_ms", e.DurationMillis))
		if res.AlreadyApplied {
			// A settlement retried after its first try committed: the line says so even where
			// the metrics line stands for the request.
			r.AddAttrs(slog.Bool("already_applied", true))
		}
		_ = h.Handle(ctx, r) // as Logger's: a line that cannot be written is lost alone
	}
	g.opt.Metrics.Request(e, g.opt.Clock.Now())
}

// eventAttrs are every field of a usage event but its version, for the lines that must hold the
// whole bill of a request.
func eventAttrs(e usage.Event) []slog.Attr {
	return []slog.Attr{
		slog.String("generation_id", e.GenerationID), slog.String("org_id", e.OrgID), slog.String("key_id", e.KeyID),
		slog.String("model", e.Model), slog.String("endpoint", e.Endpoint), slog.Bool("stream", e.Stream),
		slog.String("status", string(e.Status)), slog.Int("http_status", e.HTTPStatus),
		slog.Int64("prompt_tokens", e.PromptTokens), slog.Int64("cached_tokens", e.CachedTokens), slog.Int64("completion_tokens", e.CompletionTokens),
		slog.String("cost", e.Cost.String()), slog.Bool("estimated", e.Estimated),
		slog.String("finish_reason", e.FinishReason), slog.Time("started_at", e.StartedAt),
		slog.Int64("ttft_ms", e.TTFTMillis), slog.Int64("duration_ms", e.DurationMillis), slog.String("backend", e.Backend),
	}
}

// settled forgets a generation once it is settled (or abandoned).
func (g *Gateway) settled(generationID string) {
	if _, ok := g.unsettled.LoadAndDelete(generationID); ok {
		g.admitted.Add(-1)
	}
}

// running returns the event as admitted of a generation of this organization that this process
// is still serving.
func (g *Gateway) running(orgID, generationID string) (usage.Event, bool) {
	v, ok := g.unsettled.Load(generationID)
	if !ok || v.(*usage.Event).OrgID != orgID {
		return usage.Event{}, false
	}
	return *v.(*usage.Event), true
}

// settleRetrying applies a settlement, retrying with backoff while the store fails, until giveUp
// (and on Lambda no later than a second before the invocation's deadline): a request the client
// received must not go unbilled because the store blinked. Settle is idempotent, so a retry after
// a lost answer changes nothing. Each try has at most 10 s. The backoff is on the gateway's
// clock; the tries' timeouts, like the invocation's deadline, are on the system's.
func (g *Gateway) settleRetrying(reqCtx context.Context, st store.Settlement, giveUp time.Time) (store.SettleResult, error) {
	clock := g.opt.Clock
	if dl, ok := reqCtx.Deadline(); ok {
		if last := clock.Now().Add(time.Until(dl) - time.Second); last.Before(giveUp) {
			giveUp = last
		}
	}
	base := context.WithoutCancel(reqCtx)
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		timeout := 10 * time.Second
		if left := giveUp.Sub(clock.Now()); left > 0 && left < timeout {
			timeout = left
		}
		ctx, cancel := context.WithTimeout(base, timeout)
		res, err := g.opt.Store.Settle(ctx, st)
		cancel()
		if err == nil || clock.Now().Add(backoff).After(giveUp) {
			return res, err
		}
		g.log.LogAttrs(base, slog.LevelWarn, "settlement failed; retrying",
			slog.String("generation_id", st.Event.GenerationID), slog.Int("attempt", attempt),
			slog.Duration("backoff", backoff), slog.String("error", err.Error()))
		g.sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Drain waits until every admitted request has been settled, its handler having returned and its
// settlement, in the background or not, having finished; or until ctx ends. A server's Shutdown
// waits for handlers, but one that timed out leaves handlers running that Drain still waits for.
func (g *Gateway) Drain(ctx context.Context) error {
	for g.admitted.Load() > 0 || g.unsettledLate.Load() > 0 {
		select {
		case <-ctx.Done():
			return errors.Join(errors.New("requests not yet settled"), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}
