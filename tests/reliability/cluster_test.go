package reliability

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Figures of the many-gateways scenario; RELIABILITY.md quotes them.
const (
	clusterGateways = 4
	clusterClients  = 64
	clusterLimit    = 8
	clusterDuration = 60 * time.Second
	clusterTokens   = 4
)

// TestManyGatewaysOneStore runs four gateway processes on one DynamoDB Local with one
// organization of limit 8 and 64 clients sending short streams for a minute: never more than 8 in
// flight across the processes (by the clients' own count of open 200 answers, and by sampling
// the lease map), every answer a 200 or a 429, every 200 recorded once and debited once, the
// ledger equal to the events. Then one process is killed with SIGKILL in the middle of 8 streams:
// their slots come back within the lease time, and nothing is billed for them.
func TestManyGatewaysOneStore(t *testing.T) {
	ddb := dynamoServer(t)
	st, prefix := newDynamoStore(t, ddb.Endpoint)
	simURL := startSimulator(t, "sim/continuous")
	cat := writeCatalog(t, model{ID: "ok", URL: simURL, Backend: "sim/continuous", Continuous: true})
	const org = "org_cluster"
	key := newOrg(t, st, org, clusterLimit, "1000.00")

	// The store's deadlines are far above what DynamoDB Local takes on a quiet machine (a few
	// milliseconds), so that the load, not a loaded machine, decides the answers: with the
	// defaults, a 2 s admission deadline and a 3 s lease, DynamoDB Local starved of CPU (load
	// average 18 on 2 cores; 200 latency p99 10 s) made 503 store_unavailable answers, slot_lost
	// streams and settlements past their wait. The limit, the exactness of the ledger and the
	// answers expected stay as they are.
	gatewayEnv := func(leaseTTL string) []string {
		return []string{
			"KILN_STORE=dynamodb",
			"KILN_DYNAMODB_ENDPOINT=" + ddb.Endpoint,
			"KILN_TABLE_PREFIX=" + prefix,
			"KILN_CATALOG=" + cat,
			"KILN_DATA_DIR=" + filepath.Join(t.TempDir(), "unused"),
			"KILN_LEASE_TTL=" + leaseTTL,
			"KILN_ADMIT_TIMEOUT=30s",
			"KILN_SETTLE_WAIT=60s",
		}
	}
	gws := make([]*gatewayProc, clusterGateways)
	var wg sync.WaitGroup
	for i := range gws {
		wg.Go(func() { gws[i] = startGateway(t, gatewayEnv("30s")...) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// The load.
	var (
		open, maxOpen         atomic.Int64
		requests, ok, limited atomic.Int64
		maxLeases             atomic.Int64
		mu                    sync.Mutex
		unexpected            []string
		genIDs                = map[string]answer{}
		latencies             []time.Duration
	)
	bad := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(unexpected) < 20 {
			unexpected = append(unexpected, fmt.Sprintf(format, a...))
		}
	}
	// Clients start no request after the run's end but finish the ones they have, so that every
	// request counted has a known outcome.
	ctx, cancel := context.WithTimeout(context.Background(), clusterDuration)
	defer cancel()
	reqCtx, cancelReqs := context.WithTimeout(context.Background(), clusterDuration+2*time.Minute)
	defer cancelReqs()
	samplerDone := make(chan struct{})
	samples := 0
	go func() {
		defer close(samplerDone)
		for ctx.Err() == nil {
			held, err := st.InFlight(context.Background(), org, time.Now())
			if err == nil {
				samples++
				if n := int64(len(held)); n > maxLeases.Load() {
					maxLeases.Store(n)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	start := time.Now()
	var clients sync.WaitGroup
	for c := range clusterClients {
		clients.Add(1)
		go func() {
			defer clients.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for n := 0; ctx.Err() == nil; n++ {
				gw := gws[(c+n)%len(gws)]
				content := fmt.Sprintf("client %d request %d [[sim:delay_ms=10]]", c, n)
				t0 := time.Now()
				status, genID, err := clusterRequest(reqCtx, gw.Base, key, content, &open, &maxOpen)
				requests.Add(1)
				switch {
				case err != nil:
					bad("client %d: %v", c, err)
				case status == 200:
					ok.Add(1)
					mu.Lock()
					genIDs[genID] = answer{content, clusterTokens}
					latencies = append(latencies, time.Since(t0))
					mu.Unlock()
				case status == 429:
					limited.Add(1)
					time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond) // a client's backoff
				default:
					bad("client %d: status %d", c, status)
				}
			}
		}()
	}
	clients.Wait()
	<-samplerDone
	elapsed := time.Since(start)
	for _, u := range unexpected {
		t.Error(u)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	p := func(q float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(q*float64(len(latencies)-1))]
	}
	t.Logf("%v: %d requests (%d × 200, %d × 429, %.0f completed/s), at most %d open 200s seen by clients, at most %d leases in %d samples; 200 latency p50 %v p99 %v",
		elapsed.Round(time.Millisecond), requests.Load(), ok.Load(), limited.Load(), float64(ok.Load())/elapsed.Seconds(),
		maxOpen.Load(), maxLeases.Load(), samples, p(0.5), p(0.99))
	if maxOpen.Load() > clusterLimit || maxLeases.Load() > clusterLimit {
		t.Errorf("more than %d in flight: clients saw %d open, the lease map held %d", clusterLimit, maxOpen.Load(), maxLeases.Load())
	}
	if ok.Load()+limited.Load() != requests.Load() {
		t.Errorf("%d requests, %d + %d answered 200 or 429", requests.Load(), ok.Load(), limited.Load())
	}
	if ok.Load() < 50 {
		t.Errorf("only %d requests completed", ok.Load())
	}

	// Every 200 settled once, at its exact cost; nothing else recorded; ledger = events.
	waitIdle(t, st, org, 15*time.Second)
	checkLedger(t, st, org, genIDs, "1000.00")

	// SIGKILL a process with a 3 s lease in the middle of 8 streams.
	killMidStream(t, st, startGateway(t, gatewayEnv("3s")...), gws[1], key, org)
}

// clusterRequest sends one short stream and counts it open from its 200 until its last chunk of
// content (the one with its finish reason), or the first event after its content: both lie inside
// the time its slot is held (admission comes before the headers; the release, which comes before
// the stream's last event so that the slot is free when the client sees the end, comes after every
// chunk of the answer is sent), so the count can never legitimately exceed the limit.
func clusterRequest(ctx context.Context, base, key, content string, open, maxOpen *atomic.Int64) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions",
		strings.NewReader(chatBody("ok", content, true, clusterTokens)))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	genID := resp.Header.Get("X-Neocloud-Generation-Id")
	if resp.StatusCode == 429 {
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), `"code":"rate_limit_exceeded"`) || resp.Header.Get("Content-Type") != "application/json" {
			return 0, "", fmt.Errorf("429 body %q", b)
		}
		for h := range resp.Header {
			if strings.Contains(strings.ToLower(h), "ratelimit") {
				return 0, "", fmt.Errorf("429 with rate-limit header %s", h)
			}
		}
		return 429, genID, nil
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, genID, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	n := open.Add(1)
	for {
		m := maxOpen.Load()
		if n <= m || maxOpen.CompareAndSwap(m, n) {
			break
		}
	}
	closed := false
	defer func() {
		if !closed {
			open.Add(-1)
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	chunks, done := 0, false
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if isContent(d) {
			chunks++
			if strings.Contains(d, `"finish_reason":"`) && !closed {
				open.Add(-1) // the answer's last chunk (vLLM puts the finish reason on it)
				closed = true
			}
			continue
		}
		if !closed && (chunks > 0 || d == "[DONE]") {
			open.Add(-1)
			closed = true
		}
		done = done || d == "[DONE]"
	}
	if err := sc.Err(); err != nil {
		return 200, genID, err
	}
	if !done || chunks != clusterTokens {
		return 200, genID, fmt.Errorf("%s: stream ended without [DONE] or with %d chunks", genID, chunks)
	}
	return 200, genID, nil
}

// checkLedger checks that the organization's events are exactly the given generations, each at
// its exact cost, each debited once, and that the balance is the top-up less the debits.
// answer is a complete stream a client received: its prompt's text and its length in tokens.
type answer struct {
	content string
	tokens  int
}

func checkLedger(t *testing.T, st store.Store, org string, genIDs map[string]answer, credits string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var events []usage.Event
	for {
		var err error
		events, err = st.Usage(context.Background(), org, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(events) >= len(genIDs) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	seen := map[string]bool{}
	var sum money.Amount
	for _, e := range events {
		if seen[e.GenerationID] {
			t.Errorf("%s recorded twice", e.GenerationID)
		}
		seen[e.GenerationID] = true
		sum += e.Cost
		a, ok := genIDs[e.GenerationID]
		if !ok {
			t.Errorf("event %s (%s, %d) is no request a client saw succeed", e.GenerationID, e.Status, e.HTTPStatus)
			continue
		}
		want := cost(t, int64(len(strings.Fields(a.content))), int64(a.tokens))
		if e.Status != usage.StatusCompleted || e.Estimated || e.Cost != want {
			t.Errorf("%s: %s, estimated %v, cost %s, want %s", e.GenerationID, e.Status, e.Estimated, e.Cost, want)
		}
	}
	for id := range genIDs {
		if !seen[id] {
			t.Errorf("%s answered 200 but has no event", id)
		}
	}
	by, debited := debits(t, st, org)
	for id, d := range by {
		if len(d) != 1 || !seen[id] {
			t.Errorf("%s debited %d times (event recorded: %v)", id, len(d), seen[id])
		}
	}
	o, err := st.Org(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := money.Parse(credits)
	if debited != -sum || o.Balance != top+debited {
		t.Errorf("ledger: debits %s, events %s, balance %s (top-up %s)", debited, sum, o.Balance, top)
	}
	t.Logf("%d events, %d debits, %s billed = %s debited; balance %s", len(events), len(by), sum, -debited, o.Balance)
}

// killMidStream fills the organization's limit with long streams on victim, a gateway with a 3 s
// lease, kills that process with SIGKILL, and checks that the slots come back within the lease
// TTL and that nothing is billed for the killed streams; other refuses while they run, and
// fills the limit again after.
func killMidStream(t *testing.T, st store.Store, victim, other *gatewayProc, key, org string) {
	type stream struct {
		genID  string
		chunks atomic.Int64
		done   chan struct{}
	}
	streams := make([]*stream, clusterLimit)
	for i := range streams {
		s := &stream{done: make(chan struct{})}
		streams[i] = s
		req, _ := http.NewRequest(http.MethodPost, victim.Base+"/chat/completions",
			strings.NewReader(chatBody("ok", fmt.Sprintf("long stream %d [[sim:delay_ms=50]]", i), true, 2000)))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("long stream %d: %v %v", i, err, resp)
		}
		s.genID = resp.Header.Get("X-Neocloud-Generation-Id")
		go func() {
			defer close(s.done)
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && isContent(d) {
					s.chunks.Add(1)
				}
			}
		}()
	}
	// Let every stream deliver a little and renew its lease at least once (every 1 s): on a
	// loaded machine the first chunks can take longer than that, so wait for them.
	opened := time.Now()
	for i, s := range streams {
		for s.chunks.Load() == 0 {
			if time.Since(opened) > 30*time.Second {
				t.Fatalf("stream %d delivered nothing in 30 s", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(time.Until(opened.Add(1500 * time.Millisecond)))
	if held, _ := st.InFlight(context.Background(), org, time.Now()); len(held) != clusterLimit {
		t.Fatalf("%d leases held before the kill, want %d", len(held), clusterLimit)
	}
	if r := post(context.Background(), other.Base, key, "/chat/completions", chatBody("ok", "while full", true, 1)); r.status != 429 {
		t.Fatalf("with %d streams open on the victim, another gateway answered %d", clusterLimit, r.status)
	}
	victim.kill()
	killed := time.Now()
	delivered := int64(0)
	for _, s := range streams {
		<-s.done
		delivered += s.chunks.Load()
	}

	// Every slot back within the lease TTL (plus the renewal period and a margin for the poll),
	// as the store lists them at the time asked, however long a loaded store takes to answer.
	var back time.Duration
	for {
		asked := time.Now()
		held, err := st.InFlight(context.Background(), org, asked)
		if err == nil && len(held) == 0 {
			back = asked.Sub(killed)
			break
		}
		if asked.Sub(killed) > 6*time.Second {
			t.Fatalf("%d leases still held %v after the kill (lease TTL 3 s): %v", len(held), asked.Sub(killed), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Admission clears expired leases itself: the organization fills its limit again at once.
	fillLimit(t, st, other.Base, key, org, "ok", clusterLimit)
	t.Logf("SIGKILL with %d streams open (%d chunks delivered): leases expired %v after the kill; the limit of %d filled again on the other gateways",
		clusterLimit, delivered, back.Round(10*time.Millisecond), clusterLimit)

	// Nothing billed for the killed streams: no event, no debit (billed 0 ≤ delivered).
	by, _ := debits(t, st, org)
	for _, s := range streams {
		if _, err := st.Generation(context.Background(), org, s.genID); err == nil {
			t.Errorf("killed stream %s has an event", s.genID)
		}
		if len(by[s.genID]) > 0 {
			t.Errorf("killed stream %s debited %v", s.genID, by[s.genID])
		}
	}
}
