package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// causeSlotLost is the cause of a request's cancellation when its lease could not be renewed in
// time: it stops being served before the lease expires, so that the organization never has more
// than its limit of requests served at once, however long the store stalls.
var causeSlotLost = errors.New("in-flight lease could not be renewed")

// slotLost reports whether ctx ended because the request's lease could not be renewed.
func slotLost(ctx context.Context) bool { return errors.Is(context.Cause(ctx), causeSlotLost) }

// slot is an admitted request's in-flight lease, renewed until the request is settled, and the
// fence that stops the request should the lease go unrenewed. Renewals and the fence run on
// timers; mu guards everything but lost.
type slot struct {
	mu      sync.Mutex
	lease   store.Lease
	renewer Timer
	fence   Timer
	settled bool
	lost    context.CancelCauseFunc // cancels the exchange's fenced context
}

// stop ends the renewals and the fence, for settlement, and returns the lease as last renewed.
func (s *slot) stop() store.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled = true
	s.renewer.Stop()
	s.fence.Stop()
	return s.lease
}

// renewLeases renews the exchange's lease every third of its TTL until settlement, so that a
// long stream keeps its slot and a crashed one loses it, and arms the fence: should the lease go
// unrenewed until the fence margin before it expires (fenceIn) (the store stalled, or the lease was lost), the
// request's backend call is cancelled with causeSlotLost and the request stops being served. The
// timers, on the gateway's clock, are created under the slot's mu, which every renewal and the
// fence take before they touch them, and neither re-arms once the exchange is settled: nothing
// outlives settlement.
func (g *Gateway) renewLeases(x *exchange) {
	every := g.opt.LeaseTTL / 3
	s := &x.slot
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewer = g.opt.Clock.AfterFunc(every, func() { g.renewLease(s, every) })
	s.fence = g.opt.Clock.AfterFunc(g.fenceIn(s.lease), func() { g.checkFence(s) })
}

// fenceIn is how long from now a request holding lease may be served without a renewal: until
// the fence margin before it expires, a sixth of the lease (10 s of the default 60 s), so that
// renewals every third of it have two tries left, and the gateways' clocks, which expiry is
// measured by, may disagree by less than that.
func (g *Gateway) fenceIn(lease store.Lease) time.Duration {
	return max(lease.Expires.Sub(g.opt.Clock.Now())-g.opt.LeaseTTL/6, 0)
}

func (g *Gateway) checkFence(s *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settled {
		return
	}
	if wait := g.fenceIn(s.lease); wait > 0 {
		s.fence.Reset(wait) // renewed meanwhile
		return
	}
	g.log.LogAttrs(context.Background(), slog.LevelWarn, "lease about to expire unrenewed; stopping the request",
		slog.String("generation_id", s.lease.HolderID), slog.String("org_id", s.lease.OrgID))
	s.lost(causeSlotLost)
}

func (g *Gateway) renewLease(s *slot, every time.Duration) {
	s.mu.Lock()
	lease, settled := s.lease, s.settled
	s.mu.Unlock()
	if settled {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	renewed, err := g.opt.Store.Renew(ctx, lease, g.opt.Clock.Now(), g.opt.LeaseTTL)
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelWarn, "lease renewal failed", slog.String("generation_id", lease.HolderID), slog.String("org_id", lease.OrgID), slog.String("error", err.Error()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.settled: // settlement took the lease as it was; nothing re-arms
	case errors.Is(err, store.ErrLeaseLost):
		s.lost(causeSlotLost) // the slot is gone; renewing again cannot bring it back
	default:
		if err == nil {
			s.lease = renewed
		}
		s.renewer.Reset(every)
	}
}
