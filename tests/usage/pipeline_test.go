// Package pipeline tests the usage pipeline end to end on real local services: the gateway (the
// real handler, wired as on Lambda: nothing published per request) on DynamoDB Local, whose usage
// table's stream the pipe's stand-in (pkg/usage/pipe) carries to a moto SQS queue with a
// dead-letter queue, as the EventBridge Pipe does on AWS, and the real aggregator code
// (usage.Handler and usage.Aggregator) consuming that queue. It also runs the built gateway as
// `make run` starts it on DynamoDB Local (its own pipe, straight into the aggregator), and counts
// the AWS calls a request makes.
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
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/gateway"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/pkg/usage/pipe"
	"github.com/neocloud/kiln/tests/internal/build"
	"github.com/neocloud/kiln/tests/internal/output"
)

var ddb, moto *dynamotest.Server

// gatewayBin is functions/gateway, built for the test that runs it as `make run` does.
var gatewayBin string

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var wg sync.WaitGroup
	var errDDB, errMoto, errBuild error
	wg.Go(func() { ddb, errDDB = dynamotest.StartDynamoDBLocal(ctx) })
	wg.Go(func() { moto, errMoto = dynamotest.StartMoto(ctx) })
	binDir, err := os.MkdirTemp("", "kiln-usage-")
	if err == nil {
		var bins []string
		bins, errBuild = build.Commands(binDir, "./functions/gateway")
		if errBuild == nil {
			gatewayBin = bins[0]
		}
	} else {
		errBuild = err
	}
	wg.Wait()
	cancel()
	code := 1
	if errDDB != nil || errMoto != nil || errBuild != nil {
		for _, err := range []error{errDDB, errMoto, errBuild} {
			if err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: cannot start a local AWS server or build the gateway for the tests: %v\n", err)
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
	os.RemoveAll(binDir)
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

// gatewayProc is the built gateway running as `make run` starts it.
type gatewayProc struct {
	base    string // http://127.0.0.1:PORT/v1
	out     *output.Buffer
	logs    *output.Buffer // warnings and errors
	demoKey string
}

func startGateway(t *testing.T, env map[string]string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{out: &output.Buffer{}, logs: &output.Buffer{}}
	cmd := exec.Command(gatewayBin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "KILN_LOG_LEVEL=warn"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = g.out, g.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
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
		case err := <-done:
			t.Fatalf("gateway stopped: %v\n%s\n%s", err, out, g.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("gateway did not start:\n%s\n%s", out, g.logs.String())
		}
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("gateway: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
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
	for giveUp := time.Now().Add(time.Minute); ; {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		var err error
		resp, err = client.Do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", r.kind, err)
		}
		// The organization's slots are still held by settlements finishing in the background
		// (429), or a loaded machine kept admission past its deadline (503 store_unavailable;
		// an open breaker's 503 is an answer of its own, below): a well-behaved client, as the
		// OpenAI SDKs do, waits and tries again.
		retry := resp.StatusCode == http.StatusTooManyRequests
		if resp.StatusCode == http.StatusServiceUnavailable {
			body, _ := io.ReadAll(resp.Body)
			retry = bytes.Contains(body, []byte(`"store_unavailable"`))
		}
		if !retry || time.Now().After(giveUp) {
			break
		}
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
func load(t *testing.T, base string, tenants []tenant, n, conc int, rng *rand.Rand) {
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
				if err := x.r.send(t.Context(), client, base, x.t.key); err != nil {
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

// lambdaGateway is the gateway's handler as the Lambda function has it (the options the
// configuration sets, settlement before the handler returns, no pipe and no publisher), served
// over HTTP on loopback, with the model simulator for the catalog's backends on
// KILN_SIMULATOR_ADDR, on tables it creates first. It returns the API's base URL.
func lambdaGateway(t *testing.T, env map[string]string) string {
	t.Helper()
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	st, err := dynamo.Open(t.Context(), dynamo.Config{TablePrefix: cfg.TablePrefix, Endpoint: cfg.DynamoDBEndpoint, Region: cfg.Region})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateTables(t.Context()); err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Load(cfg.Catalog)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	var models []simulator.Model
	for _, m := range cat.Models {
		for _, b := range m.Backends {
			models = append(models, simulator.Model{Name: b.Model, ContextLength: m.ContextLength,
				RejectRequiredToolChoice: !m.ForcedToolChoice, Server: simulator.Software(b.Server), CachedTokens: b.CachedTokens})
		}
	}
	simLn, err := net.Listen("tcp", cfg.Simulator)
	if err != nil {
		t.Fatal(err)
	}
	sim := &http.Server{Handler: simulator.New(simulator.Config{Models: models}), ReadHeaderTimeout: 10 * time.Second}
	go sim.Serve(simLn)
	gw, err := gateway.New(gateway.Options{
		Store:         st,
		Catalog:       cat,
		Upstream:      upstream.New(cat, upstream.Options{ConnectTimeout: cfg.ConnectTimeout, HeaderTimeout: cfg.HeaderTimeout}),
		Logger:        log,
		MaxBody:       cfg.MaxBody,
		BodyTimeout:   cfg.RequestBodyTimeout,
		Keepalive:     cfg.Keepalive,
		LeaseTTL:      cfg.LeaseTTL,
		CacheTTL:      cfg.CacheTTL,
		SettleReserve: cfg.SettleReserve,
		AdmitTimeout:  cfg.AdmitTimeout,
		SettleWait:    cfg.SettleWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
		st.Close()
	})
	return "http://" + ln.Addr().String() + "/v1"
}

// demoOrgID is the organization the gateway creates at first start off Lambda.
const demoOrgID = "org_demo"

// catalogFor writes the reference catalog with its backends on simAddr.
func catalogFor(t *testing.T, simAddr string) string {
	t.Helper()
	catalogFile := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(catalogFile, bytes.ReplaceAll(catalog.ReferenceYAML(), []byte("127.0.0.1:8090"), []byte(simAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	return catalogFile
}

// newTenants creates n organizations with credits and a key each.
func newTenants(t *testing.T, st *dynamo.Store, n int) []tenant {
	t.Helper()
	var tenants []tenant
	now := time.Now().UTC()
	for i := 1; i <= n; i++ {
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
	return tenants
}

// TestPipeline drives a few hundred requests of every outcome through the real gateway, wired as
// on Lambda, with the queue refusing the pipe's batches for a while; drains the pipeline through
// the real aggregator code, and checks that the aggregates equal the usage records and the
// ledger's debits exactly; then redelivers every message twice, shuffled, and adds a poison
// message.
func TestPipeline(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, uint64(time.Now().UnixNano())))
	p := newPipeline(t, moto.Endpoint, fmt.Sprintf("kiln%d", os.Getpid()))
	queue := newFaultyQueue(t, moto.Endpoint)

	simAddr := freeAddr(t)
	storeCfg := ddb.Config()
	env := map[string]string{
		"KILN_STORE":             "dynamodb",
		"KILN_DYNAMODB_ENDPOINT": ddb.Endpoint,
		"KILN_TABLE_PREFIX":      storeCfg.TablePrefix,
		"KILN_CATALOG":           catalogFor(t, simAddr),
		"KILN_SIMULATOR_ADDR":    simAddr,
		"AWS_REGION":             "us-east-1",
	}
	base := lambdaGateway(t, env)
	st, err := dynamo.Open(t.Context(), storeCfg)
	if err != nil {
		t.Fatal(err)
	}
	tenants := newTenants(t, st, 4)
	orgs := []string{}
	for _, tn := range tenants {
		orgs = append(orgs, tn.orgID)
	}

	// The pipe: the usage table's stream to the queue, through the faulty proxy.
	arn, err := pipe.StreamOf(t.Context(), st.Client(), st.Tables().Usage)
	if err != nil {
		t.Fatal(err)
	}
	pipeLogs := &output.Buffer{}
	target := sqsTarget{client: sqs.NewFromConfig(awsConfig(), func(o *sqs.Options) { o.BaseEndpoint = aws.String(queue.srv.URL) }), queueURL: p.queueURL}
	pp := pipe.New(st.Client(), arn, target, slog.New(slog.NewJSONHandler(pipeLogs, nil)))
	pctx, stopPipe := context.WithCancel(context.Background())
	pipeDone := make(chan struct{})
	go func() { defer close(pipeDone); pp.Run(pctx, 100*time.Millisecond) }()
	t.Cleanup(func() { stopPipe(); <-pipeDone })

	// The aggregator: the real handler and fold, on its own store client.
	aggStore, err := dynamo.Open(t.Context(), storeCfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &consumer{p: p, h: usage.NewHandler(usage.NewAggregator(aggStore), nil)}
	cctx, stopConsumer := context.WithCancel(context.Background())
	consumerDone := make(chan struct{})
	go func() { defer close(consumerDone); c.run(cctx) }()
	t.Cleanup(func() { stopConsumer(); <-consumerDone })

	start := time.Now()
	// 1. A healthy queue.
	const healthy, failing = 120, 80
	load(t, base, tenants, healthy, 6, rng)
	// 2. The queue fails: half the pipe's calls answer 500, the others refuse half their entries.
	queue.failing.Store(true)
	load(t, base, tenants, failing, 6, rng)
	// Keep failing until both faults have bitten (a loaded machine may see few calls in a fixed
	// window).
	for deadline := time.Now().Add(30 * time.Second); (queue.errors.Load() == 0 || queue.refused.Load() == 0) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("queue failing: %d calls answered 500, %d entries refused", queue.errors.Load(), queue.refused.Load())
	if queue.errors.Load() == 0 || queue.refused.Load() == 0 {
		t.Errorf("the failing queue did not bite: %d errors, %d refused entries", queue.errors.Load(), queue.refused.Load())
	}
	// 3. It recovers; the pipe delivers what it held back.
	queue.failing.Store(false)

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
		if equalTotals(got, want) {
			break
		}
		if time.Now().After(drainDeadline) {
			t.Fatalf("pipeline did not drain in 90 s; aggregates\n%v\nwant\n%v\npipe logs:\n%s", got, want, tail(pipeLogs.String(), 3000))
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
	poison := `{"eventSource":"aws:dynamodb","eventName":"INSERT","dynamodb":{"NewImage":{"generation_id":{"S":"gen-poison"},"status":{"S":"completed"}}}}`
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

// TestLocalPipe runs the gateway as `make run` wires it on DynamoDB Local
// (KILN_STORE=dynamodb KILN_DYNAMODB_ENDPOINT=...): its own stand-in for the pipe reads the usage
// table's stream and folds every settled request into the aggregates, exactly as the ledger
// debits it; a shutdown reads the stream to its end first.
func TestLocalPipe(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	simAddr := freeAddr(t)
	storeCfg := ddb.Config()
	g := startGateway(t, map[string]string{
		"KILN_ADDR":              "127.0.0.1:0",
		"KILN_STORE":             "dynamodb",
		"KILN_DYNAMODB_ENDPOINT": ddb.Endpoint,
		"KILN_TABLE_PREFIX":      storeCfg.TablePrefix,
		"KILN_CATALOG":           catalogFor(t, simAddr),
		"KILN_SIMULATOR_ADDR":    simAddr,
		"KILN_SHUTDOWN_GRACE":    "5s",
	})
	st, err := dynamo.Open(t.Context(), storeCfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tenants := []tenant{{demoOrgID, g.demoKey}}
	load(t, g.base, tenants, 30, 4, rng)
	from, to := start.Add(-time.Hour), time.Now().Add(time.Hour)
	fromDay, toDay := from.UTC().Format(time.DateOnly), to.UTC().Format(time.DateOnly)
	orgs := []string{demoOrgID}
	// The local server settles after the response: the records come a moment after it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		evs, err := st.Usage(t.Context(), demoOrgID, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) >= 30 || time.Now().After(deadline) {
			break
		}
	}
	want, debits, n := expected(t, st, orgs, from, to)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := aggregates(t, st, orgs, fromDay, toDay)
		if n == 30 && equalTotals(got, want) {
			for k, tot := range perDay(got) {
				if tot.Cost != debits[k] {
					t.Errorf("%v: aggregate cost %s, ledger debits %s", k, tot.Cost, debits[k])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d usage records for 30 requests; aggregates\n%v\nwant\n%v", n, got, want)
		}
	}
}

// TestAWSCallsPerRequest counts, with a proxy in front of DynamoDB Local, the AWS calls the
// gateway wired as on Lambda makes for warm requests of every kind: two, admission and
// settlement (both TransactWriteItems), and nothing published. A key or organization lookup
// (GetItem) may come when a cache entry expires (KILN_CACHE_TTL); none is allowed here within
// the cache's lifetime, which the test sets at its 5 s maximum.
func TestAWSCallsPerRequest(t *testing.T) {
	proxy := newCountingProxy(t, ddb.Endpoint)
	simAddr := freeAddr(t)
	storeCfg := ddb.Config()
	base := lambdaGateway(t, map[string]string{
		"KILN_STORE":             "dynamodb",
		"KILN_DYNAMODB_ENDPOINT": proxy.srv.URL,
		"KILN_TABLE_PREFIX":      storeCfg.TablePrefix,
		"KILN_CATALOG":           catalogFor(t, simAddr),
		"KILN_SIMULATOR_ADDR":    simAddr,
		"KILN_CACHE_TTL":         "5s",
	})
	st, err := dynamo.Open(t.Context(), storeCfg) // straight to DynamoDB Local: not counted
	if err != nil {
		t.Fatal(err)
	}
	tn := newTenants(t, st, 1)[0]
	client := &http.Client{Timeout: 30 * time.Second}
	settled := func(before int) int {
		// Settlement may end after the client has read the response: wait for its write.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if n := proxy.snapshot()["TransactWriteItems"]; n >= before+2 || time.Now().After(deadline) {
				return n
			}
		}
	}
	// The first request warms the key and organization caches.
	if err := (request{kind: "completed", model: "qwen3-32b", tokens: 3}).send(t.Context(), client, base, tn.key); err != nil {
		t.Fatal(err)
	}
	settled(0)
	for _, kind := range []string{"completed", "streamed", "completions", "failed", "rejected", "completed", "streamed"} {
		windowStart := time.Now()
		before := proxy.snapshot()
		if err := (request{kind: kind, model: "gpt-oss-120b", tokens: 5}).send(t.Context(), client, base, tn.key); err != nil {
			t.Fatal(err)
		}
		settled(before["TransactWriteItems"])
		time.Sleep(50 * time.Millisecond) // anything else the request would still call
		after := proxy.snapshot()
		calls, total := map[string]int{}, 0
		for op, n := range after {
			if d := n - before[op]; d > 0 {
				calls[op] = d
				total += d
			}
		}
		t.Logf("%s request: %v", kind, calls)
		if time.Since(windowStart) >= 5*time.Second {
			continue // a cache entry may have expired: a lookup is allowed then
		}
		if total > 2 || calls["TransactWriteItems"] != 2 {
			t.Errorf("%s request: %d AWS calls %v, want 2 (TransactWriteItems: admission, settlement)", kind, total, calls)
		}
	}
}
