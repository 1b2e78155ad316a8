package reliability

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/usage"
)

// dynamoGateways starts n gateways on one set of DynamoDB Local tables with the given lease TTL,
// serving the model "ok" from the simulator (continuous usage) with a context of 2,000 tokens,
// so that a request's worst case is about $0.00012.
func dynamoGateways(t *testing.T, n int, ttl string) (store.Store, []*gatewayProc) {
	ddb := dynamoServer(t)
	st, prefix := newDynamoStore(t, ddb.Endpoint)
	simURL := startSimulator(t, "sim/continuous")
	cat := writeCatalog(t, model{ID: "ok", URL: simURL, Backend: "sim/continuous", Continuous: true, ContextLength: 2000})
	var gws []*gatewayProc
	for range n {
		gws = append(gws, startGateway(t,
			"KILN_STORE=dynamodb",
			"KILN_DYNAMODB_ENDPOINT="+ddb.Endpoint,
			"KILN_TABLE_PREFIX="+prefix,
			"KILN_CATALOG="+cat,
			"KILN_DATA_DIR="+filepath.Join(t.TempDir(), "unused"),
			"KILN_LEASE_TTL="+ttl,
		))
	}
	return st, gws
}

// TestSlotFreeWhenAnswerEnds: a limit-1 organization whose client sends each request when the
// last one's answer ended — half of them streamed, alternately through two gateway processes on
// DynamoDB Local, and then through one gateway on the embedded store — is never refused for its
// own finished request; and a client that leaves mid-stream frees the slot for its next request.
func TestSlotFreeWhenAnswerEnds(t *testing.T) {
	backToBack := func(t *testing.T, st store.Store, gws []*gatewayProc, key string) {
		for i := range 40 {
			gw := gws[i%len(gws)]
			r := post(context.Background(), gw.Base, key, "/chat/completions", chatBody("ok", fmt.Sprintf("back to back %d", i), i%4 < 2, 3))
			if r.status != 200 || (i%4 < 2 && !r.done) {
				t.Fatalf("request %d through gateway %d: %d %v %.300s\n%s", i, i%len(gws), r.status, r.err, r.body, gw.stderr.String())
			}
		}
		// A client that leaves mid-stream: its next request is admitted as soon as the gateway
		// has noticed (a few milliseconds); it retries on 429 only for that.
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gws[0].Base+"/chat/completions",
			strings.NewReader(chatBody("ok", "leaving [[sim:delay_ms=50]]", true, 100)))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream to leave: %v %v", resp, err)
		}
		br := bufio.NewReader(resp.Body)
		for range 3 {
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		resp.Body.Close()
		left := time.Now()
		for {
			r := post(context.Background(), gws[len(gws)-1].Base, key, "/chat/completions", chatBody("ok", "after leaving", false, 1))
			if r.status == 200 {
				t.Logf("the slot of the stream that was left was free %v after the client left", time.Since(left).Round(time.Millisecond))
				break
			}
			if r.status != 429 || time.Since(left) > 10*time.Second {
				t.Fatalf("after the client left: %d %s", r.status, r.body)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Run("dynamodb two gateways", func(t *testing.T) {
		st, gws := dynamoGateways(t, 2, "60s")
		backToBack(t, st, gws, newOrg(t, st, "org_pace", 1, "10.00"))
	})
	t.Run("embedded", func(t *testing.T) {
		simURL := startSimulator(t, "sim/continuous")
		dir := filepath.Join(t.TempDir(), "data")
		st, err := sqlite.Open(dir, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		key := newOrg(t, st, "org_pace", 1, "10.00")
		gw := startGateway(t,
			"KILN_DATA_DIR="+dir,
			"KILN_CATALOG="+writeCatalog(t, model{ID: "ok", URL: simURL, Backend: "sim/continuous", Continuous: true}),
		)
		backToBack(t, st, []*gatewayProc{gw}, key)
	})
}

// TestStoreFrozenPastLease: a limit-1 organization streams slowly on a gateway whose lease TTL is
// 3 s; DynamoDB Local is frozen (SIGSTOP) for 6 s. The stream stops being served before its lease
// expires — it ends with a slot_lost event and is billed what it delivered — and a second request
// of the organization, retried meanwhile, is served only after the first stopped: never two at
// once on a limit of one.
func TestStoreFrozenPastLease(t *testing.T) {
	ddb := dynamoServer(t)
	st, gws := dynamoGateways(t, 1, "3s")
	gw := gws[0]
	key := newOrg(t, st, "org_frozen", 1, "10.00")
	t.Cleanup(func() { _ = ddb.resume() })

	type seen struct {
		lastContent time.Time // of the first stream
		secondOK    time.Time // the second request's 200
	}
	var s seen
	first := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, gw.Base+"/chat/completions", strings.NewReader(chatBody("ok", "slowly [[sim:delay_ms=300]]", true, 60)))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			first <- result{err: err}
			return
		}
		defer resp.Body.Close()
		r := result{status: resp.StatusCode, genID: resp.Header.Get("X-Neocloud-Generation-Id")}
		sc := bufio.NewScanner(resp.Body)
		var body strings.Builder
		for sc.Scan() {
			line := sc.Text()
			body.WriteString(line + "\n")
			if d, ok := strings.CutPrefix(line, "data: "); ok && isContent(d) {
				s.lastContent = time.Now()
			}
		}
		r.body = []byte(body.String())
		r.parseSSE()
		first <- r
	}()
	time.Sleep(1500 * time.Millisecond)
	if err := ddb.pause(); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	second := make(chan result, 1)
	go func() {
		for {
			r := post(context.Background(), gw.Base, key, "/chat/completions", chatBody("ok", "second", false, 1))
			if r.status == 200 || time.Since(frozen) > 30*time.Second {
				s.secondOK = time.Now()
				second <- r
				return
			}
			if r.status != 429 && r.status != 503 {
				second <- r
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	time.Sleep(6 * time.Second)
	if err := ddb.resume(); err != nil {
		t.Fatal(err)
	}
	r1, r2 := <-first, <-second
	if r1.errCode != "slot_lost" || r1.done {
		t.Fatalf("the stream whose lease lapsed ended with %q (done %v): %.500s", r1.errCode, r1.done, r1.body)
	}
	if r2.status != 200 {
		t.Fatalf("second request: %d %s", r2.status, r2.body)
	}
	if !s.lastContent.Before(s.secondOK) {
		t.Errorf("the first stream delivered content at %v, after the second request was served at %v", s.lastContent.Sub(frozen), s.secondOK.Sub(frozen))
	}
	if served := s.lastContent.Sub(frozen); served > 3*time.Second {
		t.Errorf("the first stream was served %v into a freeze of a 3 s lease", served)
	}
	t.Logf("freeze at 0: first stream's last content at %v (%d chunks), second served at %v",
		s.lastContent.Sub(frozen).Round(time.Millisecond), r1.chunks, s.secondOK.Sub(frozen).Round(time.Millisecond))
	ev := waitEvent(t, st, "org_frozen", r1.genID)
	if ev.Status != usage.StatusSlotLost || ev.CompletionTokens != int64(r1.chunks) {
		t.Errorf("record of the fenced stream: %+v; want slot_lost, the %d chunks delivered", ev, r1.chunks)
	}
	checkBilled(t, st, ev, cost(t, ev.PromptTokens, int64(r1.chunks)))
	waitIdle(t, st, "org_frozen", 15*time.Second)
}

// TestMoneyUnderChaos drives random concurrent work through three gateways on one DynamoDB Local:
// an organization with a few cents and a limit of 2 flooded by clients that retry 402s and 429s
// after 100–300 ms, streamed and non-streamed answers of random length, clients that leave mid-
// stream, top-ups once the credits ran out, and one gateway SIGKILLed in the middle. From the
// store's own records, sampled all the while and read afterwards: no balance or available amount
// was ever below zero, never more than the limit of leases at once, every answer a client
// received complete was debited exactly its usage.cost once, nothing was debited without a usage
// record, and the final balance is the top-up less the debits. The flood does not starve the
// settlements of the flooded organization: their p99 stays within ten times the p99 of the
// refusals answered in the same flood (one store call each), so that a loaded machine, which
// slows both, does not fail the test, and a settlement queued behind refusals does.
func TestMoneyUnderChaos(t *testing.T) {
	st, gws := dynamoGateways(t, 3, "3s")
	// A request reserves about $0.00012: with $0.0004 three fit, and the limit of 2 binds first,
	// until the debits bring the balance below what three reserve; then 402s and 429s mix.
	const org, limit, credits = "org_chaos", 2, "0.0004"
	key := newOrg(t, st, org, limit, credits)

	began := time.Now()
	stop := make(chan struct{})
	var sampling sync.WaitGroup
	var worstBalance, worstAvailable atomic.Int64
	var mostLeases, samples atomic.Int64
	sampling.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			o, err := st.Org(context.Background(), org)
			leases, err2 := st.InFlight(context.Background(), org, time.Now())
			if err != nil || err2 != nil {
				continue
			}
			samples.Add(1)
			worstBalance.Store(min(worstBalance.Load(), int64(o.Balance)))
			worstAvailable.Store(min(worstAvailable.Load(), int64(o.Available())))
			mostLeases.Store(max(mostLeases.Load(), int64(len(leases))))
		}
	})

	var mu sync.Mutex
	complete := map[string]money.Amount{} // generation → usage.cost the client received
	counts := map[string]int{}
	var settleWaits, refusals []time.Duration
	var clients sync.WaitGroup
	alive := func(i int) *gatewayProc { return gws[i%len(gws)] }
	var killed atomic.Bool
	for c := range 18 {
		clients.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				gi := rng.IntN(len(gws))
				if killed.Load() && gi == 0 {
					gi = 1 + rng.IntN(len(gws)-1)
				}
				streamed, tokens := rng.IntN(2) == 0, 1+rng.IntN(12)
				leave := streamed && rng.IntN(5) == 0
				content := fmt.Sprintf("chaos %d %d [[sim:delay_ms=%d]]", c, i, rng.IntN(30))
				out := chaosRequest(alive(gi).Base, key, content, streamed, tokens, leave)
				mu.Lock()
				counts[fmt.Sprint(out.status)]++
				if out.status == 402 || out.status == 429 {
					refusals = append(refusals, out.took)
				}
				if out.complete {
					complete[out.genID] = out.cost
					if out.settleWait > 0 {
						settleWaits = append(settleWaits, out.settleWait)
					}
				}
				mu.Unlock()
				if out.status == 402 || out.status == 429 || out.status == 503 {
					time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
				}
			}
		})
	}
	// A top-up now and then keeps requests flowing between 402s: at least 2 s after the last
	// one, and once the organization has been refused for credits since, so that 402s and 429s
	// mix however few requests a loaded machine lets through (at 8 answers a second, a top-up
	// every 2 s outran the debits and no 402 came).
	topUps := money.Amount(0)
	refused := 0
	for i := range 6 {
		time.Sleep(2 * time.Second)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			n := counts["402"]
			mu.Unlock()
			if n > refused {
				refused = n
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("no 402 within a minute before top-up %d", i)
				break
			}
		}
		amount := money.Amount(50_000_000) // $0.00005
		if err := st.AddEntry(context.Background(), store.LedgerEntry{ID: fmt.Sprintf("chaos_top_%d", i), OrgID: org, Kind: store.EntryTopUp, Amount: amount, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		topUps += amount
		if i == 2 {
			killed.Store(true)
			gws[0].kill()
		}
	}
	close(stop)
	clients.Wait()
	sampling.Wait()
	t.Logf("load done after %v", time.Since(began).Round(time.Millisecond))
	t.Logf("outcomes %v; %d complete answers; %d samples: lowest balance %s, lowest available %s, most leases %d",
		counts, len(complete), samples.Load(), money.Amount(worstBalance.Load()), money.Amount(worstAvailable.Load()), mostLeases.Load())
	if worstBalance.Load() < 0 || worstAvailable.Load() < 0 {
		t.Errorf("a balance below zero: lowest balance %s, lowest available %s", money.Amount(worstBalance.Load()), money.Amount(worstAvailable.Load()))
	}
	if mostLeases.Load() > limit {
		t.Errorf("%d leases at once on a limit of %d", mostLeases.Load(), limit)
	}
	if counts["402"] == 0 || counts["429"] == 0 || len(complete) < 20 {
		t.Errorf("the run did not exercise what it should: %v, %d complete", counts, len(complete))
	}
	slices.Sort(settleWaits)
	slices.Sort(refusals)
	if n, m := len(settleWaits), len(refusals); n > 0 && m > 0 {
		p99, refusedP99 := settleWaits[(n-1)*99/100], refusals[(m-1)*99/100]
		t.Logf("time from an answer's last chunk to its end (its settlement): p50 %v, p99 %v, max %v; a refusal's answer: p50 %v, p99 %v",
			settleWaits[n/2], p99, settleWaits[n-1], refusals[m/2], refusedP99)
		if p99 > max(time.Second, 10*refusedP99) {
			t.Errorf("settlements under the flood took %v at p99, over ten times the refusals' %v", p99, refusedP99)
		}
	}

	waitIdle(t, st, org, 15*time.Second)
	t.Logf("idle after %v", time.Since(began).Round(time.Millisecond))
	events, err := st.Usage(context.Background(), org, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]usage.Event{}
	var billed money.Amount
	for _, e := range events {
		recorded[e.GenerationID] = e
		billed += e.Cost
	}
	for id, c := range complete {
		e, ok := recorded[id]
		if !ok || e.Cost != c {
			t.Errorf("%s: the client received an answer costing %s; recorded %+v (%v)", id, c, e, ok)
		}
	}
	by, debited := debits(t, st, org)
	for id, d := range by {
		e, ok := recorded[id]
		if len(d) != 1 || !ok || d[0] != -e.Cost {
			t.Errorf("%s debited %v; recorded %v at %s", id, d, ok, e.Cost)
		}
	}
	o, err := st.Org(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := money.Parse(credits)
	if -debited != billed || o.Balance != top+topUps+debited || o.Balance < 0 || o.Reserved != 0 {
		t.Errorf("ledger: debits %s, events %s, balance %s, reserved %s (top-ups %s)", -debited, billed, o.Balance, o.Reserved, top+topUps)
	}
	t.Logf("%d events, %d debits, %s billed = %s debited; balance %s", len(events), len(by), billed, -debited, o.Balance)
}

// chaosOutcome is what a chaos client saw of one request.
type chaosOutcome struct {
	status     int
	genID      string
	complete   bool          // the whole answer arrived: a body, or a stream to [DONE]
	cost       money.Amount  // its usage.cost
	settleWait time.Duration // stream: from the last content chunk to [DONE], its settlement's wait
	took       time.Duration // a refusal: from sending the request to its answer's end
}

// chaosRequest sends one request with include_usage on streams, and reads it whole, or leaves a
// stream after its first content.
func chaosRequest(base, key, content string, streamed bool, tokens int, leave bool) chaosOutcome {
	body := chatBody("ok", content, false, tokens)
	if streamed {
		body = fmt.Sprintf(`{"model":"ok","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, tokens, content)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return chaosOutcome{}
	}
	defer resp.Body.Close()
	out := chaosOutcome{status: resp.StatusCode, genID: resp.Header.Get("X-Neocloud-Generation-Id")}
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		out.took = time.Since(sent)
		return out
	}
	if !streamed {
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			out.cost, out.complete = usageCost(string(b))
		}
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	var contentAt time.Time
	haveUsage := false
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if isContent(d) {
			if leave {
				return out
			}
			contentAt = time.Now()
		}
		if c, ok := usageCost(d); ok && strings.Contains(d, `"choices":[]`) {
			out.cost, haveUsage = c, true
		}
		if d == "[DONE]" && haveUsage && !contentAt.IsZero() {
			out.complete, out.settleWait = true, time.Since(contentAt)
		}
	}
	return out
}

// usageCost reads usage.cost from a JSON body or chunk.
func usageCost(s string) (money.Amount, bool) {
	_, rest, ok := strings.Cut(s, `"cost":`)
	if !ok {
		return 0, false
	}
	end := strings.IndexAny(rest, ",}")
	if end < 0 {
		return 0, false
	}
	a, err := money.Parse(rest[:end])
	return a, err == nil
}

// TestStalledStoreHoldsNoWork: 128 clients send requests as fast as they are answered while
// DynamoDB Local is frozen for 4 s. Admission's deadline (2 s) and the bound on admissions waiting
// for the store (256) answer every one with a prompt 503 store_unavailable, nothing hangs, and the
// gateway's memory stays flat; once the store is back, requests are served and nothing is left
// held.
func TestStalledStoreHoldsNoWork(t *testing.T) {
	ddb := dynamoServer(t)
	st, gws := dynamoGateways(t, 1, "60s")
	gw := gws[0]
	key := newOrg(t, st, "org_stall", 8, "10.00")
	t.Cleanup(func() { _ = ddb.resume() })
	if r := post(context.Background(), gw.Base, key, "/chat/completions", chatBody("ok", "warm", false, 1)); r.status != 200 {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	before := gw.rssBytes(t)
	if err := ddb.pause(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var clients sync.WaitGroup
	var mu sync.Mutex
	counts := map[int]int{}
	var slowest time.Duration
	var peak atomic.Int64
	for range 128 {
		clients.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				began := time.Now()
				r := post(ctx, gw.Base, key, "/chat/completions", chatBody("ok", "during the stall", false, 1))
				took := time.Since(began)
				cancel()
				mu.Lock()
				counts[r.status]++
				slowest = max(slowest, took)
				if r.status != 503 || !strings.Contains(string(r.body), `"code":"store_unavailable"`) {
					t.Errorf("during the stall: %d %v %.200s after %v", r.status, r.err, r.body, took)
				}
				mu.Unlock()
			}
		})
	}
	for range 8 {
		time.Sleep(500 * time.Millisecond)
		peak.Store(max(peak.Load(), gw.rssBytes(t)))
	}
	close(stop)
	clients.Wait()
	if err := ddb.resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("during a 4 s freeze: %v; slowest answer %v; RSS %d MiB before, at most %d MiB during",
		counts, slowest.Round(time.Millisecond), before>>20, peak.Load()>>20)
	if slowest > 5*time.Second {
		t.Errorf("an answer took %v during the stall; admission's deadline is 2 s", slowest)
	}
	if grew := peak.Load() - before; grew > 64<<20 {
		t.Errorf("RSS grew by %d MiB during the stall", grew>>20)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := post(context.Background(), gw.Base, key, "/chat/completions", chatBody("ok", "after the stall", false, 1))
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the stall: %d %s", r.status, r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitIdle(t, st, "org_stall", 15*time.Second)
}
