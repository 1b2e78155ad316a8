// Package pipeline tests the usage pipeline end to end on real local services: the gateway (the
// real handler, wired by pkg/local as `make run` wires it) on DynamoDB Local, publishing to a moto
// EventBridge bus whose rule fills a moto SQS queue with a dead-letter queue, and the real
// aggregator code (pkg/ingest and usage.Aggregator) consuming that queue.
package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/neocloud/kiln/infra"
	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/ingest"
	"github.com/neocloud/kiln/pkg/local"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/tests/internal/output"
)

var ddb, moto *dynamotest.Server

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var wg sync.WaitGroup
	var errDDB, errMoto error
	wg.Go(func() { ddb, errDDB = dynamotest.StartDynamoDBLocal(ctx) })
	wg.Go(func() { moto, errMoto = dynamotest.StartMoto(ctx) })
	wg.Wait()
	cancel()
	code := 1
	if errDDB != nil || errMoto != nil {
		for _, err := range []error{errDDB, errMoto} {
			if err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: cannot start a local AWS server for the tests: %v\n", err)
			}
		}
	} else {
		code = m.Run()
	}
	for _, s := range []*dynamotest.Server{ddb, moto} {
		if s != nil {
			s.Stop()
		}
	}
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// gatewayProc is the gateway running in this process through local.Run.
type gatewayProc struct {
	base    string // http://127.0.0.1:PORT/v1
	out     *output.Buffer
	logs    *output.Buffer
	stop    context.CancelFunc
	done    chan error
	demoKey string
}

func startGateway(t *testing.T, env map[string]string) *gatewayProc {
	t.Helper()
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	g := &gatewayProc{out: &output.Buffer{}, logs: &output.Buffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	g.stop = cancel
	log := slog.New(slog.NewJSONHandler(g.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { g.done <- local.Run(ctx, cfg, func(k string) string { return env[k] }, log, g.out) }()
	listening := regexp.MustCompile(`listening on (http://\S+/v1)`)
	key := regexp.MustCompile(`export KILN_API_KEY=(\S+)`)
	deadline := time.Now().Add(time.Minute)
	for {
		out := g.out.String()
		if m, k := listening.FindStringSubmatch(out), key.FindStringSubmatch(out); m != nil && k != nil {
			g.base, g.demoKey = m[1], k[1]
			break
		}
		select {
		case err := <-g.done:
			t.Fatalf("gateway stopped: %v\n%s\n%s", err, out, g.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not start:\n%s\n%s", out, g.logs.String())
		}
	}
	t.Cleanup(func() {
		g.stop()
		select {
		case err := <-g.done:
			if err != nil {
				t.Errorf("gateway: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("gateway did not stop")
		}
		if t.Failed() {
			t.Logf("gateway logs (warnings and errors):\n%s", tail(g.logs.String(), 3000))
		}
	})
	return g
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// request is one kind of request the test sends.
type request struct {
	kind   string // completed, streamed, completions, disconnected, failed, rejected
	model  string
	tokens int
}

func (r request) send(ctx context.Context, client *http.Client, base, key string) error {
	path, body := "/chat/completions", map[string]any{"model": r.model, "max_tokens": r.tokens}
	msg := fmt.Sprintf("count these words please [[sim:cached=%d]]", r.tokens%4)
	messages := []map[string]string{{"role": "user", "content": msg}}
	switch r.kind {
	case "completions":
		path, body["prompt"] = "/completions", msg
	case "streamed":
		body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
	case "disconnected":
		body["stream"] = true
		messages[0]["content"] = "slowly [[sim:delay_ms=20]]"
		body["max_tokens"] = 200
	case "failed":
		messages[0]["content"] = "break [[sim:status=500]]"
	case "rejected":
		messages = []map[string]string{}
	}
	if r.kind != "completions" {
		body["messages"] = messages
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var resp *http.Response
	for try := 0; ; try++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		var err error
		resp, err = client.Do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", r.kind, err)
		}
		if resp.StatusCode != http.StatusTooManyRequests || try == 200 {
			break
		}
		// The organization's slots are still held by settlements finishing in the
		// background: a well-behaved client waits and tries again.
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(time.Duration(10+rand.IntN(20)) * time.Millisecond)
	}
	defer resp.Body.Close()
	if r.kind == "disconnected" {
		// Read a few events, then leave.
		sc := bufio.NewScanner(resp.Body)
		for n := 0; n < 6 && sc.Scan(); {
			if strings.HasPrefix(sc.Text(), "data:") {
				n++
			}
		}
		cancel()
		return nil
	}
	io.Copy(io.Discard, resp.Body)
	want := map[string]int{"failed": http.StatusBadGateway, "rejected": http.StatusBadRequest}[r.kind]
	if want == 0 {
		want = http.StatusOK
	}
	// A backend's circuit breaker opens after three failures in a row: requests for that model
	// are answered 503 for a few seconds, and leave an upstream_error event like the others.
	if resp.StatusCode != want && !(resp.StatusCode == http.StatusServiceUnavailable && r.kind != "rejected") {
		return fmt.Errorf("%s on %s: status %d, want %d", r.kind, r.model, resp.StatusCode, want)
	}
	return nil
}

type tenant struct {
	orgID, key string
}

// load sends n requests of every kind across the tenants and models, conc at a time.
func load(t *testing.T, g *gatewayProc, tenants []tenant, n, conc int, rng *rand.Rand) {
	t.Helper()
	kinds := []string{"completed", "completed", "completed", "streamed", "streamed", "streamed", "completions",
		"completions", "disconnected", "disconnected", "failed", "rejected"}
	models := []string{"qwen3-32b", "gpt-oss-120b"}
	reqs := make(chan struct {
		r request
		t tenant
	})
	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range conc {
		wg.Go(func() {
			for x := range reqs {
				if err := x.r.send(t.Context(), client, g.base, x.t.key); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for range n {
		reqs <- struct {
			r request
			t tenant
		}{request{kind: kinds[rng.IntN(len(kinds))], model: models[rng.IntN(len(models))], tokens: 1 + rng.IntN(40)}, tenants[rng.IntN(len(tenants))]}
	}
	close(reqs)
	wg.Wait()
	for _, err := range errs[:min(len(errs), 5)] {
		t.Errorf("request: %v", err)
	}
}

// dayKey names one organization's UTC day (and model, for the per-model check).
type dayKey struct{ org, day, model string }

// expected computes, from the settlement records and the ledger, what the aggregates must hold:
// per organization × day × model, and per organization × day the sum of the ledger's debits.
func expected(t *testing.T, st *dynamo.Store, orgs []string, from, to time.Time) (map[dayKey]usage.Totals, map[dayKey]money.Amount, int) {
	t.Helper()
	want := map[dayKey]usage.Totals{}
	debits := map[dayKey]money.Amount{}
	n := 0
	for _, org := range orgs {
		evs, err := st.Usage(t.Context(), org, from, to)
		if err != nil {
			t.Fatal(err)
		}
		day := map[string]string{}
		for _, e := range evs {
			n++
			k := dayKey{org, e.Day(), e.Model}
			tot := want[k]
			if err := tot.Add(usage.TotalsOf(e)); err != nil {
				t.Fatal(err)
			}
			want[k] = tot
			day[e.GenerationID] = e.Day()
		}
		ledger, err := st.Ledger(t.Context(), org)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ledger {
			if l.Kind != store.EntryDebit {
				continue
			}
			d, ok := day[l.ID]
			if !ok {
				t.Errorf("debit %s of %s has no usage record", l.ID, org)
				continue
			}
			debits[dayKey{org, d, ""}] -= l.Amount
		}
	}
	return want, debits, n
}

// aggregates reads the day × model roll-ups of the organizations.
func aggregates(t *testing.T, st *dynamo.Store, orgs []string, fromDay, toDay string) map[dayKey]usage.Totals {
	t.Helper()
	got := map[dayKey]usage.Totals{}
	for _, org := range orgs {
		rs, err := st.DailyRollups(t.Context(), org, fromDay, toDay)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			got[dayKey{org, r.Day, r.Model}] = r.Totals
		}
	}
	return got
}

func perDay(m map[dayKey]usage.Totals) map[dayKey]usage.Totals {
	out := map[dayKey]usage.Totals{}
	for k, v := range m {
		d := dayKey{k.org, k.day, ""}
		tot := out[d]
		tot.Add(v)
		out[d] = tot
	}
	return out
}

func equalTotals(a, b map[dayKey]usage.Totals) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestPipeline drives a few hundred requests of every outcome through the real gateway with the
// EventBridge bus failing for a while, drains the pipeline through the real aggregator code, and
// checks that the aggregates equal the events and the ledger's debits exactly; then redelivers
// every message twice, shuffled, and adds a poison message.
func TestPipeline(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, uint64(time.Now().UnixNano())))
	p := newPipeline(t, moto.Endpoint, fmt.Sprintf("kiln%d", os.Getpid()))
	bus := newFaultyBus(t, moto.Endpoint)

	// The reference catalog, its backends on a port of this test's own.
	simAddr := freeAddr(t)
	catalogFile := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(catalogFile, bytes.ReplaceAll(infra.ReferenceCatalog, []byte("127.0.0.1:8090"), []byte(simAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	storeCfg := ddb.Config()
	env := map[string]string{
		"KILN_ADDR":                 "127.0.0.1:0",
		"KILN_STORE":                "dynamodb",
		"KILN_DYNAMODB_ENDPOINT":    ddb.Endpoint,
		"KILN_TABLE_PREFIX":         storeCfg.TablePrefix,
		"KILN_EVENT_BUS":            p.bus,
		"KILN_EVENTBRIDGE_ENDPOINT": bus.srv.URL,
		"KILN_CATALOG":              catalogFile,
		"KILN_SIMULATOR_ADDR":       simAddr,
		"KILN_USAGE_SWEEP":          "2s",
		"KILN_SHUTDOWN_GRACE":       "5s",
		"AWS_REGION":                "us-east-1",
	}
	g := startGateway(t, env) // creates the tables, the demo organization and its key
	st, err := dynamo.Open(t.Context(), storeCfg)
	if err != nil {
		t.Fatal(err)
	}

	// Three more organizations with credits and a key each.
	tenants := []tenant{{local.DemoOrgID, g.demoKey}}
	now := time.Now().UTC()
	for i := 1; i <= 3; i++ {
		org := fmt.Sprintf("org_%d", i)
		if err := st.CreateOrg(t.Context(), store.Org{ID: org, Name: org, Status: store.OrgActive, MaxInFlight: 8, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := st.AddEntry(t.Context(), store.LedgerEntry{ID: "top", OrgID: org, Kind: store.EntryTopUp, Amount: money.Amount(5_000_000_000_000), At: now}); err != nil {
			t.Fatal(err)
		}
		key, id, hash, err := apikey.New()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CreateKey(t.Context(), store.Key{ID: id, OrgID: org, Hash: hash, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		tenants = append(tenants, tenant{org, key})
	}
	orgs := []string{}
	for _, tn := range tenants {
		orgs = append(orgs, tn.orgID)
	}

	// The aggregator: the real handler and fold, on its own store client.
	aggStore, err := dynamo.Open(t.Context(), storeCfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &consumer{p: p, h: ingest.New(usage.NewAggregator(aggStore), nil)}
	cctx, stopConsumer := context.WithCancel(context.Background())
	consumerDone := make(chan struct{})
	go func() { defer close(consumerDone); c.run(cctx) }()
	t.Cleanup(func() { stopConsumer(); <-consumerDone })

	start := time.Now()
	// 1. A healthy bus.
	// moto's PutEvents costs about 100 ms an entry (and runs one request at a time): 200 events
	// and the retries take it about half a minute.
	const healthy, failing = 120, 80
	load(t, g, tenants, healthy, 6, rng)
	// 2. The bus fails: half the calls answer 500, the others refuse half their entries.
	bus.failing.Store(true)
	load(t, g, tenants, failing, 6, rng)
	// Keep failing until both faults have bitten and the workers have given up on some events
	// (a loaded machine may see few PutEvents calls in a fixed window).
	for deadline := time.Now().Add(30 * time.Second); (bus.errors.Load() == 0 || bus.refused.Load() == 0) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	left, err := st.Unpublished(t.Context(), time.Now().Add(time.Hour), 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bus failing: %d calls answered 500, %d entries refused, %d events left in the outbox", bus.errors.Load(), bus.refused.Load(), len(left))
	if bus.errors.Load() == 0 || bus.refused.Load() == 0 || len(left) == 0 {
		t.Errorf("the failing bus did not bite: %d errors, %d refused entries, %d unpublished", bus.errors.Load(), bus.refused.Load(), len(left))
	}
	// 3. It recovers; the sweep publishes what the failures left.
	bus.failing.Store(false)

	from, to := start.Add(-time.Hour), time.Now().Add(time.Hour)
	fromDay, toDay := from.UTC().Format(time.DateOnly), to.UTC().Format(time.DateOnly)
	want, debits, nEvents := expected(t, st, orgs, from, to)
	if nEvents != healthy+failing {
		t.Errorf("%d usage records for %d requests", nEvents, healthy+failing)
	}
	drainDeadline := time.Now().Add(90 * time.Second)
	var got map[dayKey]usage.Totals
	for {
		got = aggregates(t, aggStore, orgs, fromDay, toDay)
		unpub, err := st.Unpublished(t.Context(), time.Now().Add(time.Hour), 1)
		if err != nil {
			t.Fatal(err)
		}
		if equalTotals(got, want) && len(unpub) == 0 {
			break
		}
		if time.Now().After(drainDeadline) {
			t.Fatalf("pipeline did not drain in 90 s: %d unpublished; aggregates\n%v\nwant\n%v", len(unpub), got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("drained %d events in %v (%d messages received)", nEvents, time.Since(start).Round(time.Millisecond), c.received.Load())

	// Per organization × day: aggregate cost = events' cost = ledger debits, exactly; tokens too.
	days := perDay(want)
	for k, tot := range perDay(got) {
		if tot != days[k] {
			t.Errorf("%v: aggregates %+v, events %+v", k, tot, days[k])
		}
		if tot.Cost != debits[k] {
			t.Errorf("%v: aggregate cost %s, ledger debits %s", k, tot.Cost, debits[k])
		}
	}
	for k, d := range debits {
		if perDay(got)[k].Cost != d {
			t.Errorf("%v: ledger debits %s without the same aggregate cost", k, d)
		}
	}
	monthly := map[string]usage.Totals{}
	for _, org := range orgs {
		rs, err := aggStore.MonthlyRollups(t.Context(), org, from.UTC().Format("2006-01"), to.UTC().Format("2006-01"))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			m := monthly[org]
			m.Add(r.Totals)
			monthly[org] = m
		}
	}
	fromDays := map[string]usage.Totals{}
	for k, tot := range perDay(want) {
		m := fromDays[k.org]
		m.Add(tot)
		fromDays[k.org] = m
	}
	for _, org := range orgs {
		if monthly[org] != fromDays[org] {
			t.Errorf("%s: month roll-ups %+v, the days add up to %+v", org, monthly[org], fromDays[org])
		}
	}

	// Redelivery: every message handled so far, twice, shuffled, through the queue again.
	bodies := c.handledBodies()
	replay := append(slices.Clone(bodies), bodies...)
	rng.Shuffle(len(replay), func(i, j int) { replay[i], replay[j] = replay[j], replay[i] })
	before := c.handled.Load()
	p.send(t, replay)

	// A poison message among valid ones: reported failed alone, then dead-lettered.
	poison := `{"version":"0","source":"kiln.gateway","detail-type":"usage.recorded","detail":{"generation_id":"gen-poison"}}`
	p.send(t, []string{bodies[0], poison, bodies[1], bodies[2]})
	deadline := time.Now().Add(45 * time.Second)
	for c.handled.Load() < before+int64(len(replay))+3 {
		if time.Now().After(deadline) {
			t.Fatalf("replay not handled in 45 s: %d of %d", c.handled.Load()-before, len(replay)+3)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if after := aggregates(t, aggStore, orgs, fromDay, toDay); !equalTotals(after, got) {
		t.Errorf("redelivering every message twice, shuffled, changed the aggregates:\n%v\nwas\n%v", after, got)
	}
	var dead string
	for time.Now().Before(deadline) && dead == "" {
		out, err := p.sqs.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &p.dlqURL, MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			dead = *m.Body
		}
		time.Sleep(200 * time.Millisecond)
	}
	if dead != poison {
		t.Errorf("dead-letter queue holds %q, want the poison message", dead)
	}
	poisonBatches := 0
	c.mu.Lock()
	for _, b := range c.batches {
		if !slices.Contains(b.bodies, poison) {
			if len(b.failed) > 0 {
				t.Errorf("a batch without the poison message had failures: %v", b.failed)
			}
			continue
		}
		poisonBatches++
		if len(b.failed) != 1 || !b.failed[poison] {
			t.Errorf("batch with the poison message reported %d failures, want only the poison", len(b.failed))
		}
	}
	c.mu.Unlock()
	if poisonBatches < maxReceiveCount {
		t.Errorf("poison message handled %d times, want %d before it was dead-lettered", poisonBatches, maxReceiveCount)
	}
	if n, err := p.depth(t.Context(), p.queueURL); err != nil || n != 0 {
		t.Errorf("usage queue holds %d messages at the end (%v)", n, err)
	}
	c.check(t)
}
