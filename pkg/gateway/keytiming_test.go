package gateway

import (
	"context"
	"crypto/sha256"
	"sync"
	"testing"

	"github.com/neocloud/kiln/pkg/store"
)

// recordingAuth records the hashes the gateway looks keys up by.
type recordingAuth struct {
	store.Gateway
	mu     sync.Mutex
	hashes [][32]byte
}

func (s *recordingAuth) Authenticate(ctx context.Context, h [32]byte) (store.Principal, error) {
	s.mu.Lock()
	s.hashes = append(s.hashes, h)
	s.mu.Unlock()
	return s.Gateway.Authenticate(ctx, h)
}

// TestKeyLookupRevealsNoPrefix: a wrong key is looked up by the SHA-256 of the whole key, one
// lookup whatever it shares with a real key. No code compares keys character by character, so
// the time of a 401 cannot tell how much of a key an attacker got right. (A timing measurement
// would be noise on a shared machine; this checks the property that makes it hold.)
func TestKeyLookupRevealsNoPrefix(t *testing.T) {
	t.Parallel()
	rec := &recordingAuth{}
	h := newHarness(t, config{wrapStore: func(s store.Gateway) store.Gateway { rec.Gateway = s; return rec }})
	real := h.key
	flip := func(c byte) string {
		if c == 'a' {
			return "b"
		}
		return "a"
	}
	for _, wrong := range []string{
		real[:len(real)-1] + flip(real[len(real)-1]), // all but the last character right
		real[:13] + flip(real[13]) + real[14:],       // the display prefix right, then wrong
		"kiln-" + flip(real[5]) + real[6:],           // wrong from the first secret character
	} {
		rec.mu.Lock()
		rec.hashes = nil
		rec.mu.Unlock()
		r := h.do(req{method: "GET", path: "/v1/models", key: wrong})
		if r.status != 401 {
			t.Fatalf("%d for a wrong key", r.status)
		}
		rec.mu.Lock()
		got := rec.hashes
		rec.mu.Unlock()
		if len(got) != 1 || got[0] != sha256.Sum256([]byte(wrong)) {
			t.Errorf("a wrong key was looked up %d times, not once by its whole hash", len(got))
		}
	}
}
