package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/store"
)

// authenticate reads the one Authorization header and finds its key's organization, which must
// not be suspended. Keys travel in no other header and no query parameter.
func (g *Gateway) authenticate(ctx context.Context, r *http.Request) (store.Principal, error) {
	values := r.Header.Values("Authorization")
	if len(values) == 0 {
		return store.Principal{}, errNoKey
	}
	if len(values) > 1 {
		return store.Principal{}, errBadKey // two keys: refuse rather than guess which one counts
	}
	scheme, key, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return store.Principal{}, errNoKey
	}
	key = strings.TrimSpace(key)
	if !apikey.Valid(key) {
		return store.Principal{}, errBadKey
	}
	// ctx is the caller's store context: the admission deadline, and no cancellation by a client
	// that leaves (which must not turn the lookup into a store failure, a 503 logged as an error).
	p, err := g.keys.get(ctx, apikey.Hash(key), g.opt.Clock.Now())
	switch {
	case err != nil && !known(err):
		g.log.LogAttrs(ctx, slog.LevelError, "key lookup failed", slog.String("error", err.Error()))
		return store.Principal{}, err
	case err != nil:
		return store.Principal{}, err
	case p.OrgStatus == store.OrgSuspended:
		return store.Principal{}, errSuspended
	}
	return p, nil
}

// keyCache keeps recent successful key lookups for a short time, so that a busy key costs no
// store round trip, while a revocation or suspension still reaches the gateway within the TTL.
// Unknown keys are not cached: a flood of random keys cannot grow it or pin a wrong answer.
type keyCache struct {
	store interface {
		Authenticate(context.Context, [32]byte) (store.Principal, error)
	}
	ttl time.Duration

	mu      sync.RWMutex
	entries map[[32]byte]keyEntry
}

type keyEntry struct {
	p       store.Principal
	expires time.Time
}

// maxCachedKeys bounds the cache; past it, the cache starts over.
const maxCachedKeys = 100_000

func (c *keyCache) get(ctx context.Context, hash [32]byte, now time.Time) (store.Principal, error) {
	c.mu.RLock()
	e, ok := c.entries[hash]
	c.mu.RUnlock()
	if ok && now.Before(e.expires) {
		return e.p, nil
	}
	p, err := c.store.Authenticate(ctx, hash)
	if err != nil {
		if ok {
			c.mu.Lock()
			delete(c.entries, hash)
			c.mu.Unlock()
		}
		return store.Principal{}, err
	}
	c.mu.Lock()
	if len(c.entries) >= maxCachedKeys {
		clear(c.entries)
	}
	c.entries[hash] = keyEntry{p: p, expires: now.Add(c.ttl)}
	c.mu.Unlock()
	return p, nil
}

// maintenanceCache reads the maintenance window at most once per TTL.
type maintenanceCache struct {
	store interface {
		Maintenance(context.Context) (store.Maintenance, error)
	}
	ttl time.Duration

	cur atomic.Pointer[maintenanceEntry]
	mu  sync.Mutex // one refresh at a time
}

type maintenanceEntry struct {
	m       store.Maintenance
	expires time.Time
}

// get returns the window as of now, read from the store within timeout when the cached one has
// expired (the deadline is made only then: nearly every request finds the window cached).
func (c *maintenanceCache) get(ctx context.Context, now time.Time, timeout time.Duration) (store.Maintenance, error) {
	if e := c.cur.Load(); e != nil && now.Before(e.expires) {
		return e.m, nil
	}
	// The deadline runs from here, waiting for another request's refresh included, on the
	// system's clock as contexts' deadlines do.
	deadline := time.Now().Add(timeout)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.cur.Load(); e != nil && now.Before(e.expires) {
		return e.m, nil
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	m, err := c.store.Maintenance(ctx)
	if err != nil {
		if e := c.cur.Load(); e != nil {
			// Kept for another TTL: while the store is down, one lookup per TTL waits for it,
			// not every request.
			c.cur.Store(&maintenanceEntry{m: e.m, expires: now.Add(c.ttl)})
			return e.m, err
		}
		return store.Maintenance{}, err
	}
	c.cur.Store(&maintenanceEntry{m: m, expires: now.Add(c.ttl)})
	return m, nil
}
