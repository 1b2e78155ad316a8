package reliability

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// storeRig is one gateway on DynamoDB Local, reached through a fault proxy, with clients that
// record every outcome.
type storeRig struct {
	t      *testing.T
	ddb    *dynamoLocal
	st     store.Store
	proxy  *faultProxy
	gw     *gatewayProc
	key    string
	mu     sync.Mutex
	genIDs map[string]answer
	counts map[string]int
}

const storeOrg = "org_store_faults"

func newStoreRig(t *testing.T) *storeRig {
	ddb := dynamoServer(t)
	st, prefix := newDynamoStore(t, ddb.Endpoint)
	proxy := newFaultProxy(t, strings.TrimPrefix(ddb.Endpoint, "http://"))
	simURL := startSimulator(t, "sim/continuous")
	key := newOrg(t, st, storeOrg, 8, "100.00")
	gw := startGateway(t,
		"KILN_STORE=dynamodb",
		"KILN_DYNAMODB_ENDPOINT=http://"+proxy.addr,
		"KILN_TABLE_PREFIX="+prefix,
		"KILN_CATALOG="+writeCatalog(t, model{ID: "ok", URL: simURL, Backend: "sim/continuous", Continuous: true}),
		"KILN_DATA_DIR="+filepath.Join(t.TempDir(), "unused"),
		"KILN_CACHE_TTL=1s",
	)
	t.Cleanup(func() { _ = ddb.resume() })
	r := &storeRig{t: t, ddb: ddb, st: st, proxy: proxy, gw: gw, key: key, genIDs: map[string]answer{}, counts: map[string]int{}}
	warm := post(context.Background(), gw.Base, key, "/chat/completions", chatBody("ok", "warm up", true, 1))
	if warm.status != 200 {
		t.Fatalf("warm-up: %d %s", warm.status, warm.body)
	}
	r.genIDs[warm.genID] = answer{"warm up", 1}
	return r
}

// load sends requests from n clients until stop is closed and records each outcome: a complete
// stream, or a prompt 503 JSON error; anything else fails the test.
func (rig *storeRig) load(n int, stop <-chan struct{}, phase string, tokens int) *sync.WaitGroup {
	t, gw, key := rig.t, rig.gw, rig.key
	mu, genIDs, counts := &rig.mu, rig.genIDs, rig.counts
	var wg sync.WaitGroup
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				content := fmt.Sprintf("%s client %d request %d [[sim:delay_ms=50]]", phase, c, i)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				t0 := time.Now()
				r := post(ctx, gw.Base, key, "/chat/completions", chatBody("ok", content, true, tokens))
				took := time.Since(t0)
				cancel()
				mu.Lock()
				switch {
				case r.err != nil:
					t.Errorf("%s: transport error after %v: %v", phase, took, r.err)
				case r.status == 200 && r.done && r.chunks == tokens:
					genIDs[r.genID] = answer{content, tokens}
					counts[phase+" 200"]++
				case r.status == 429 && r.ctype == "application/json" && strings.Contains(string(r.body), `"code":"rate_limit_exceeded"`):
					// Slots stay taken while their settlements wait for the store to come back.
					counts[phase+" 429"]++
				case r.status == 503 && r.ctype == "application/json" && strings.Contains(string(r.body), `"type":"service_unavailable"`):
					counts[phase+" 503"]++
					if took > 10*time.Second {
						t.Errorf("%s: 503 after %v", phase, took)
					}
				default:
					t.Errorf("%s: %d %q after %v: %.300s", phase, r.status, r.ctype, took, r.body)
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	return &wg
}

// check waits until no slot is held and checks the ledger against the complete streams.
func (rig *storeRig) check() {
	t := rig.t
	t.Logf("outcomes: %v", rig.counts)
	for _, line := range strings.Split(rig.gw.stderr.String(), "\n") {
		if strings.Contains(line, "settlement failed") {
			t.Logf("gateway: %.300s", line)
		}
	}
	waitIdle(t, rig.st, storeOrg, 15*time.Second)
	checkLedger(t, rig.st, storeOrg, rig.genIDs, "100.00")
}

// TestStorePause freezes DynamoDB Local (SIGSTOP for 4 s, then SIGCONT) while streams are open
// and new requests arrive: requests wait and then complete (or get a 503 JSON error), none hangs
// or gets a 500; afterwards no slot is held, every 200 has one event and one debit, and the
// ledger equals the events.
func TestStorePause(t *testing.T) {
	rig := newStoreRig(t)
	stop := make(chan struct{})
	wg := rig.load(6, stop, "pause", 20)
	time.Sleep(700 * time.Millisecond)
	if err := rig.ddb.pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	if err := rig.ddb.resume(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if rig.counts["pause 200"] == 0 {
		t.Errorf("no stream completed: %v", rig.counts)
	}
	rig.check()
}

// TestStoreOutage cuts the gateway off its DynamoDB for 3 s (the fault proxy refuses new
// connections and resets the open ones, pooled or in a call, as when a store node goes away):
// every request gets a prompt 503 JSON error or completes; afterwards no slot is held and the
// ledger equals the events of every 200. (With pooled connections left to pass, whether any
// call needed a new connection during the outage was a matter of timing, and so was the 503.)
func TestStoreOutage(t *testing.T) {
	rig := newStoreRig(t)
	rig.proxy.set(fault{kind: cutOff})
	stop := make(chan struct{})
	wg := rig.load(8, stop, "outage", 3)
	time.Sleep(3 * time.Second)
	rig.proxy.set(fault{kind: pass})
	close(stop)
	wg.Wait()
	if rig.counts["outage 503"] == 0 {
		t.Errorf("no 503 during the outage: %v", rig.counts)
	}
	rig.check()
}
