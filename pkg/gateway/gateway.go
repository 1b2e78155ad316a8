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
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// GenerationHeader names the response header carrying the request's generation id.
const GenerationHeader = "X-Neocloud-Generation-Id"

// Options wire a Gateway. Store, Catalog and Upstream are required.
type Options struct {
	Store    store.Gateway
	Catalog  *catalog.Catalog
	Upstream *upstream.Pool
	Logger   *slog.Logger // nil discards

	MaxBody       int64         // request body limit; default 5 MiB
	Keepalive     time.Duration // backend silence before ": keepalive"; default 15 s
	LeaseTTL      time.Duration // in-flight lease; default store.DefaultLeaseTTL
	CacheTTL      time.Duration // key and maintenance cache; default 2 s, at most 5 s
	SettleReserve time.Duration // with a request deadline (Lambda), stop this long before it; default 5 s
	// SettleRetryFor is how long a settlement is retried while the store fails; default 5 min.
	SettleRetryFor time.Duration
	Now            func() time.Time

	// Metrics receives every settled request and refused admission (metrics.go). Optional.
	Metrics *Metrics

	// Publish receives every settled usage event, after the response ended. Optional.
	Publish func(context.Context, usage.Event)

	// SettleInBackground settles after the handler returns, so that a keep-alive connection's
	// next request does not wait for the store. The slot stays taken until settlement is done;
	// call Drain before the process exits. Not for Lambda, which may freeze the process as soon
	// as the handler returns.
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
	settling   atomic.Int64 // settlements running in the background
	admitted   atomic.Int64 // requests admitted and not yet settled (unsettled's size)
	settlers   settlers     // run background settlements
	unsettled  sync.Map     // generation id → *pending, from admission to the end of settlement
}

// New builds a Gateway.
func New(opt Options) (*Gateway, error) {
	if opt.Store == nil || opt.Catalog == nil || opt.Upstream == nil {
		return nil, errors.New("gateway: Store, Catalog and Upstream are required")
	}
	if opt.MaxBody <= 0 {
		opt.MaxBody = 5 << 20
	}
	if opt.Keepalive <= 0 {
		opt.Keepalive = 15 * time.Second
	}
	if opt.LeaseTTL <= 0 {
		opt.LeaseTTL = store.DefaultLeaseTTL
	}
	if opt.CacheTTL <= 0 || opt.CacheTTL > 5*time.Second {
		opt.CacheTTL = 2 * time.Second
	}
	if opt.SettleReserve <= 0 {
		opt.SettleReserve = 5 * time.Second
	}
	if opt.SettleRetryFor <= 0 {
		opt.SettleRetryFor = 5 * time.Minute
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{
		opt:      opt,
		log:      log,
		keys:     newKeyCache(opt.Store, opt.CacheTTL),
		maint:    &maintenanceCache{store: opt.Store, ttl: opt.CacheTTL},
		settlers: settlers{idleFor: settlerIdle, maxIdle: maxIdleSettlers},
	}
	g.modelsList, g.modelByID = renderModels(opt.Catalog)
	return g, nil
}

// ServeHTTP routes the public API. Only the /v1 paths exist; unknown paths answer 404 in the
// error shape. ServeHTTP is under every open stream on its goroutine's stack; the routes other
// than inference are in serveInfo, to keep its frame small (see infer).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/chat/completions":
		g.infer(w, r, chatEndpoint)
	case "/v1/completions":
		g.infer(w, r, completionsEndpoint)
	default:
		g.serveInfo(w, r)
	}
}

// serveInfo routes the paths that are not inference.
func (g *Gateway) serveInfo(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/healthz":
		g.healthz(w, r)
	case path == "/v1/models":
		g.get(w, r, g.listModels)
	case strings.HasPrefix(path, "/v1/models/"):
		g.get(w, r, g.getModel)
	case path == "/v1/credits":
		g.get(w, r, g.credits)
	case path == "/v1/generation":
		g.get(w, r, g.generation)
	default:
		g.notFound(w, r)
	}
}

// notFound answers a path the API does not have.
func (g *Gateway) notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, errNotFound("Unknown request URL: "+r.Method+" "+r.URL.Path+". The API's base URL ends in /v1.", "unknown_url"))
}

// notPost answers a request to an inference endpoint that is not a POST.
func notPost(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	writeError(w, errMethod(r, http.MethodPost))
}

// get runs steps 1, 3 and 4 of the contract for the read-only endpoints, then h.
func (g *Gateway) get(w http.ResponseWriter, r *http.Request, h func(http.ResponseWriter, *http.Request, store.Principal)) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, errMethod(r, http.MethodGet))
		return
	}
	ctx := r.Context()
	if e := g.checkMaintenance(ctx); e != nil {
		writeError(w, e)
		return
	}
	p, e := g.authenticate(ctx, r)
	if e != nil {
		writeError(w, e)
		return
	}
	if p.OrgStatus == store.OrgSuspended {
		writeError(w, errSuspended)
		return
	}
	h(w, r, p)
}

// Drain waits until every admitted request has been settled, its handler having returned and its
// settlement, in the background or not, having finished; or until ctx ends. A server's Shutdown
// waits for handlers, but one that timed out leaves handlers running that Drain still waits for.
func (g *Gateway) Drain(ctx context.Context) error {
	for g.admitted.Load() > 0 || g.settling.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d requests not yet settled: %w", max(g.admitted.Load(), g.settling.Load()), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func (g *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

func (g *Gateway) checkMaintenance(ctx context.Context) *apiError {
	m, err := g.maint.get(ctx, g.opt.Now())
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelError, "maintenance lookup failed", slog.String("error", err.Error()))
		return nil // an unreadable window must not take the service down with it
	}
	if m.Active(g.opt.Now()) {
		return errMaintenance(m.Until)
	}
	return nil
}
