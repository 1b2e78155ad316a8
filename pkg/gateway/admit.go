package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Bounds on the work a slow store can make the gateway hold (contract §7, backpressure).
const (
	// maxAdmitting is how many admissions may wait for the store at once; beyond it a request
	// is refused at once with 503 store_unavailable.
	maxAdmitting = 256
	// maxUnsettled is how many settlements that did not commit before their answer ended may
	// wait for the store; while that many wait, admissions are refused with 503.
	maxUnsettled = 1024
)

// errBacklog refuses an admission while the gateway already holds all the store work it may.
var errBacklog = errors.New("too many admissions or settlements waiting for the store")

// admit runs steps 1 to 6 of the contract: maintenance, body size, key, organization, credits and
// an in-flight slot with its reservation; then step 7, the endpoint checks. The body is checked
// before admission, because the reservation is the checked request's worst case, but a check's
// error is answered only once the request is admitted, in the contract's order. It returns the
// admitted exchange, and the error of its checks; or no exchange and why it was not admitted.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, ep *endpoint) (*exchange, error) {
	ctx := r.Context()
	started := g.opt.Clock.Now()

	// 1. Maintenance.
	if err := g.checkMaintenance(ctx); err != nil {
		return nil, err
	}
	// 2. Body size. The body is read whole before authentication, as the order requires; the
	// limit bounds what an anonymous client can make us hold.
	body, err := g.readBody(w, r)
	if err != nil {
		return nil, err
	}
	// 3, 4. Key and organization. The key lookup and the admission share one deadline: a
	// stalled store answers 503 within it. A client's departure does not cancel them: it could
	// cancel the admission after the store took the slot and before its answer came back.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.opt.AdmitTimeout)
	defer cancel()
	p, err := g.authenticate(sctx, r)
	if err != nil {
		return nil, err
	}
	req, modelID, checkErr := g.check(ep, body)
	reserve := money.Amount(0) // a request refused at step 7 costs nothing
	if checkErr == nil {
		reserve = worstCase(ep, &req)
	}
	// 5, 6. Credits and an in-flight slot, in one store call.
	genID := newGenerationID(started)
	areq := store.AdmitRequest{OrgID: p.OrgID, HolderID: genID, Now: started, TTL: g.opt.LeaseTTL, Reserve: reserve}
	lease, err := g.admitSlot(sctx, areq)
	if err != nil {
		g.opt.Metrics.Refused(err, p.OrgID, started)
		if !refused(err) && !errors.Is(err, errBacklog) {
			g.releaseUnknown(areq)
		}
		refusal := &admissionError{err: err, reserve: reserve, limit: p.MaxInFlight}
		if !known(refusal) {
			g.log.LogAttrs(ctx, slog.LevelError, "admission failed", slog.String("generation_id", genID), slog.String("org_id", p.OrgID), slog.String("error", err.Error()))
		}
		return nil, refusal
	}
	// The request has a usage event from here on, and its id names it.
	w.Header().Set(GenerationHeader, genID)
	fenced, lost := context.WithCancelCause(ctx)
	x := &exchange{
		g:      g,
		w:      w,
		reqCtx: ctx,
		fenced: fenced,
		ep:     ep,
		admitted: &usage.Event{
			Version:      usage.SchemaVersion,
			GenerationID: genID,
			OrgID:        p.OrgID,
			KeyID:        p.KeyID,
			Endpoint:     ep.name,
			StartedAt:    started,
			Status:       usage.StatusInProgress,
			Model:        modelID,
			Stream:       req.stream,
		},
		event: decisions{Status: usage.StatusRejected},
		slot:  slot{lease: lease, lost: lost},
	}
	g.admitted.Add(1)
	g.unsettled.Store(genID, x.admitted)
	g.renewLeases(x)
	if checkErr != nil {
		return x, checkErr
	}
	x.req = &req
	return x, nil
}

// admitSlot asks the store for the slot, within the admission deadline and the gateway's bounds
// on waiting work.
func (g *Gateway) admitSlot(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	select {
	case g.admitting <- struct{}{}:
		defer func() { <-g.admitting }()
	default:
		return store.Lease{}, errBacklog
	}
	if g.unsettledLate.Load() >= maxUnsettled {
		return store.Lease{}, errBacklog
	}
	return g.opt.Store.Admit(ctx, req)
}

// refused reports whether an admission's error is the store's answer, not a failure to get one.
func refused(err error) bool {
	for _, target := range []error{store.ErrSuspended, store.ErrInsufficientCredits, store.ErrSlotsFull, store.ErrNotFound, store.ErrExists} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// releaseUnknown gives up the lease of an admission whose call failed or timed out: the store may
// yet apply it (a stalled server works off what it had received), and a lease nobody settles would
// hold a slot and its reservation until it expired. Off Lambda it is released in the background,
// looked for a few times while the store recovers; at most maxUnsettled such releases run at
// once, and beyond them, and on Lambda, such a lease expires after its TTL.
func (g *Gateway) releaseUnknown(req store.AdmitRequest) {
	if !g.opt.SettleInBackground || g.unsettledLate.Load() >= maxUnsettled {
		return
	}
	lease := store.Lease{OrgID: req.OrgID, HolderID: req.HolderID, Expires: req.Now.Add(g.opt.LeaseTTL), Reserved: req.Reserve}
	g.unsettledLate.Add(1)
	go func() {
		defer g.unsettledLate.Add(-1)
		backoff, misses := 100*time.Millisecond, 0
		for g.opt.Clock.Now().Before(lease.Expires) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			released, err := g.opt.Store.Release(ctx, lease)
			cancel()
			if released {
				g.log.LogAttrs(ctx, slog.LevelInfo, "released the lease of an admission that timed out",
					slog.String("generation_id", lease.HolderID), slog.String("org_id", lease.OrgID))
				return
			}
			if err == nil {
				if misses++; misses == 3 {
					return // the admission never reached the store, or will expire there
				}
				backoff = time.Second << misses
			}
			g.sleep(backoff)
			backoff = min(2*backoff, 5*time.Second)
		}
	}()
}

// readBody reads the request body under the size limit.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > g.opt.MaxBody {
		return nil, errTooLarge(g.opt.MaxBody)
	}
	n := r.ContentLength
	if n < 0 || n > 64<<10 {
		n = 64 << 10 // grow as needed; a lying Content-Length cannot make us allocate the limit
	}
	buf := make([]byte, 0, n+1)
	br := &bodyReader{body: r.Body, w: w, every: g.opt.BodyTimeout}
	body, err := readAllInto(buf, http.MaxBytesReader(w, br, g.opt.MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errTooLarge(g.opt.MaxBody)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, errRequestTimeout(g.opt.BodyTimeout)
		}
		return nil, invalid("", "", "The request body could not be read: the connection ended before the body did.")
	}
	br.done()
	return body, nil
}

// readAllInto is io.ReadAll into b: a body read into a buffer of its length plus one is read
// without growing it, and without the 512 bytes more that bytes.Buffer.ReadFrom wants free
// before each read (an open stream keeps its body: TestWaitingStreamKeepsLittle).
func readAllInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
