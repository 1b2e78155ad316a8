// Package gateway is Kiln's HTTP handler: it authenticates a key, admits the request under its
// organization's credits and in-flight limit, checks and rewrites the body, forwards it to a model
// backend, relays the answer (streamed event by event), meters it, and settles: the slot is
// released, the cost debited once and the usage event recorded, whatever happened on the way.
//
// The order of checks, the error codes and the streaming rules are those of the contract
// (shared/spec/CONTRACT.md, sections 2–7).
package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/upstream"
)

// GenerationHeader names the response header carrying the request's generation id.
const GenerationHeader = "X-Neocloud-Generation-Id"

// Options wire a Gateway. Store, Catalog and Upstream are required.
type Options struct {
	Store    store.Gateway
	Catalog  *catalog.Catalog
	Upstream *upstream.Pool
	Logger   *slog.Logger // nil discards

	MaxBody int64 // request body limit; default 5 MiB
	// BodyTimeout is the longest gap allowed between bytes of a request body, where the
	// connection has read deadlines (not on Lambda); default 10 s. A stall is a 408.
	BodyTimeout   time.Duration
	Keepalive     time.Duration // backend silence before ": keepalive"; default 15 s
	LeaseTTL      time.Duration // in-flight lease; default store.DefaultLeaseTTL
	CacheTTL      time.Duration // key and maintenance cache; default 2 s, at most 5 s
	SettleReserve time.Duration // with a request deadline (Lambda), stop this long before it; default 5 s
	// AdmitTimeout bounds admission's store call; past it the request gets 503
	// store_unavailable. Default 2 s.
	AdmitTimeout time.Duration
	// SettleWait is how long the end of an answer waits for its settlement to commit; default
	// 10 s. A settlement still failing then is retried, for up to SettleRetryFor (default 5 min).
	SettleWait     time.Duration
	SettleRetryFor time.Duration
	// Clock is the time the gateway goes by: admission, lease renewal and its fence, settlement
	// retries and their backoff, generation ids, caches and metrics. Nil is the system's clock;
	// a test passes its own, so that retries and expiry need no sleeps.
	Clock Clock

	// Metrics receives every settled request and refused admission (metrics.go). Optional.
	Metrics *Metrics

	// SettleInBackground retries, after the handler returns, a settlement that did not commit
	// before its answer ended, so that the store's outage holds no connection; call Drain before
	// the process exits. Not for Lambda, which may freeze the process as soon as the handler
	// returns: there the handler retries it before it returns.
	SettleInBackground bool
}

// Gateway is the http.Handler of the public API.
type Gateway struct {
	opt        Options
	log        *slog.Logger
	keys       *keyCache
	maint      *maintenanceCache
	modelsList []byte
	modelByID  map[string][]byte
	admitted   atomic.Int64  // requests admitted and not yet settled (unsettled's size)
	unsettled  sync.Map      // generation id → its *usage.Event as admitted, from admission to the end of settlement
	admitting  chan struct{} // a token per admission waiting for the store
	// unsettledLate counts settlements retried in the background after their answers ended.
	unsettledLate atomic.Int64
}

// New builds a Gateway.
func New(opt Options) (*Gateway, error) {
	if opt.Store == nil || opt.Catalog == nil || opt.Upstream == nil {
		return nil, errors.New("gateway: Store, Catalog and Upstream are required")
	}
	orDefault(&opt.MaxBody, 5<<20)
	orDefault(&opt.BodyTimeout, 10*time.Second)
	orDefault(&opt.Keepalive, 15*time.Second)
	orDefault(&opt.LeaseTTL, store.DefaultLeaseTTL)
	if opt.CacheTTL > 5*time.Second {
		opt.CacheTTL = 0
	}
	orDefault(&opt.CacheTTL, 2*time.Second)
	orDefault(&opt.SettleReserve, 5*time.Second)
	orDefault(&opt.AdmitTimeout, 2*time.Second)
	orDefault(&opt.SettleWait, 10*time.Second)
	orDefault(&opt.SettleRetryFor, 5*time.Minute)
	if opt.Clock == nil {
		opt.Clock = systemClock{}
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{
		opt:       opt,
		log:       log,
		keys:      &keyCache{store: opt.Store, ttl: opt.CacheTTL, entries: make(map[[32]byte]keyEntry)},
		maint:     &maintenanceCache{store: opt.Store, ttl: opt.CacheTTL},
		admitting: make(chan struct{}, maxAdmitting),
	}
	g.modelsList, g.modelByID = renderModels(opt.Catalog)
	return g, nil
}

// orDefault sets *v to def unless it is positive.
func orDefault[T int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// ServeHTTP routes the public API. Only the /v1 paths exist; unknown paths answer 404 in the
// error shape.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var err error
	switch path := r.URL.Path; {
	case path == "/v1/chat/completions":
		err = g.infer(w, r, chatEndpoint)
	case path == "/v1/completions":
		err = g.infer(w, r, completionsEndpoint)
	case path == "/healthz":
		g.healthz(w, r)
	case path == "/v1/models":
		err = g.get(w, r, g.listModels)
	case strings.HasPrefix(path, "/v1/models/"):
		err = g.get(w, r, g.getModel)
	case path == "/v1/credits":
		err = g.get(w, r, g.credits)
	case path == "/v1/generation":
		err = g.get(w, r, g.generation)
	default:
		err = errNotFound("Unknown request URL: "+clip(r.Method, quoteLen)+" "+clip(r.URL.Path, quoteLen)+". The API's base URL ends in /v1.", "unknown_url")
	}
	if err != nil {
		writeError(w, err)
	}
}

// get runs steps 1, 3 and 4 of the contract for the read-only endpoints, then h.
func (g *Gateway) get(w http.ResponseWriter, r *http.Request, h func(http.ResponseWriter, *http.Request, store.Principal) error) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return errMethod(r, http.MethodGet)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), g.opt.AdmitTimeout)
	defer cancel()
	if err := g.checkMaintenance(ctx); err != nil {
		return err
	}
	p, err := g.authenticate(ctx, r)
	if err != nil {
		return err
	}
	return h(w, r, p)
}

func (g *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// checkMaintenance answers the maintenance window's 503 while it is on. Its lookup has the
// admission deadline: a stalled store must not hold every request behind it.
func (g *Gateway) checkMaintenance(ctx context.Context) error {
	now := g.opt.Clock.Now()
	m, err := g.maint.get(ctx, now, g.opt.AdmitTimeout)
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelError, "maintenance lookup failed", slog.String("error", err.Error()))
		return nil // an unreadable window must not take the service down with it
	}
	if m.Active(now) {
		return errMaintenance(m.Until)
	}
	return nil
}

// Clock tells the time and runs functions later; the gateway's timers are made by it.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, as time.AfterFunc does.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a function's pending call of Clock.AfterFunc; *time.Timer is one.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// systemClock is the system's clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// sleep waits for d on the gateway's clock.
func (g *Gateway) sleep(d time.Duration) {
	done := make(chan struct{})
	g.opt.Clock.AfterFunc(d, func() { close(done) })
	<-done
}
