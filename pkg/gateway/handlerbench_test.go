package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// memoryGateway answers the request path's store calls in memory: the first authentication
// goes to the real store and its answer is kept, and admissions and settlements always succeed.
// BenchmarkChatHandler uses it so that what it counts is the gateway's own work, without the
// embedded store's writes and the timers that copy its slots, which make a whole-process count
// vary by several percent from run to run.
type memoryGateway struct {
	store.Gateway

	mu        sync.Mutex
	principal *store.Principal
}

func (m *memoryGateway) Authenticate(ctx context.Context, keyHash [32]byte) (store.Principal, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.principal == nil {
		p, err := m.Gateway.Authenticate(ctx, keyHash)
		if err != nil {
			return p, err
		}
		m.principal = &p
	}
	return *m.principal, nil
}

func (m *memoryGateway) Admit(_ context.Context, req store.AdmitRequest) (store.Lease, error) {
	return store.Lease{OrgID: req.OrgID, HolderID: req.HolderID, Expires: req.Now.Add(req.TTL), Reserved: req.Reserve}, nil
}

func (m *memoryGateway) Release(context.Context, store.Lease) (bool, error) { return true, nil }

func (m *memoryGateway) Renew(_ context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	lease.Expires = now.Add(ttl)
	return lease, nil
}

func (m *memoryGateway) Settle(context.Context, store.Settlement) (store.SettleResult, error) {
	return store.SettleResult{}, nil
}

func (m *memoryGateway) Maintenance(context.Context) (store.Maintenance, error) {
	return store.Maintenance{}, nil
}

// BenchmarkChatHandler is one non-streaming chat completion through the real handler, with the
// store answered in memory and a backend that replays the simulator's answer, over loopback.
// Its process runs the client, the gateway and that backend and nothing else, so an instruction
// count of it (valgrind --tool=callgrind, two values of -test.benchtime subtracted) is the
// gateway's cost per request plus a constant, and is the same from run to run.
func BenchmarkChatHandler(b *testing.B) {
	h := newHarness(b, config{
		wrapStore: func(s store.Gateway) store.Gateway { return &memoryGateway{Gateway: s} },
		// As in production: keys and the maintenance window come from the cache, and every
		// request writes its JSON log line.
		gateway: func(o *Options) {
			o.CacheTTL = 2 * time.Second
			o.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
		},
	})
	h.rec.off.Store(true)
	const content = "Answer briefly. Hello there, how are you today? [[sim:tokens=16]]"

	// The simulator's answer to the very body the gateway forwards, replayed as it was sent.
	resp, err := h.client.Post(h.simURL+"/chat/completions", "application/json",
		strings.NewReader(chatBody("Qwen/Qwen3-32B", content, `"max_tokens":64`)))
	if err != nil {
		b.Fatal(err)
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("simulator: %d, %v", resp.StatusCode, err)
	}
	contentType := resp.Header.Get("Content-Type")
	h.rec.next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", contentType)
		w.Write(answer)
	})

	body := chatBody("qwen3-32b", content, `"max_tokens":64`)
	b.ReportAllocs()
	for b.Loop() {
		benchPost(b, h.client, h.base+"/v1/chat/completions", h.key, body)
	}
}
