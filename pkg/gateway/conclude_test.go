package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// slowStore delays settlements by settleDelay, fails them while failSettle is set, fails
// renewals while failRenew is set, and holds admissions until their context ends while
// stallAdmit is set.
type slowStore struct {
	store.Gateway
	settleDelay time.Duration
	failSettle  atomic.Bool
	failRenew   atomic.Bool
	stallAdmit  atomic.Bool
	// lostAnswers makes this many settlements commit and then report a failure, as when the
	// store's answer is lost on the way back.
	lostAnswers atomic.Int64
}

var errStoreStalled = errors.New("store stalled")

func (s *slowStore) Settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	time.Sleep(s.settleDelay)
	if s.failSettle.Load() {
		return store.SettleResult{}, errStoreStalled
	}
	if s.lostAnswers.Add(-1) >= 0 {
		// The store has the write and commits it whatever the caller's deadline (which a loaded
		// machine can pass first: SettleWait may be 1 ms); only its answer does not come back.
		if _, err := s.Gateway.Settle(context.WithoutCancel(ctx), st); err != nil {
			return store.SettleResult{}, err
		}
		return store.SettleResult{}, errStoreStalled
	}
	return s.Gateway.Settle(ctx, st)
}

func (s *slowStore) Renew(ctx context.Context, l store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	if s.failRenew.Load() {
		return store.Lease{}, errStoreStalled
	}
	return s.Gateway.Renew(ctx, l, now, ttl)
}

func (s *slowStore) Admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	if s.stallAdmit.Load() {
		<-ctx.Done()
		return store.Lease{}, ctx.Err()
	}
	return s.Gateway.Admit(ctx, req)
}

// TestSlotFreeWhenAnswerEnds: a request's settlement commits before the client sees the end of
// its answer, however slow the store, so that a client of a limit-1 organization that sends each
// request when the last one ended is never refused for its own finished request, and the
// generation its header names is recorded the moment the answer ended.
func TestSlotFreeWhenAnswerEnds(t *testing.T) {
	t.Parallel()
	slow := &slowStore{settleDelay: 50 * time.Millisecond}
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.SettleInBackground = true },
		wrapStore: func(s store.Gateway) store.Gateway { slow.Gateway = s; return slow },
	})
	key, _ := h.newOrg("org_one", "1", 1)
	for i := range 12 {
		var id string
		if i%2 == 0 {
			r := h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three", `"max_tokens":4`)})
			if r.status != 200 {
				t.Fatalf("request %d: %d %s", i, r.status, r.body)
			}
			id = r.genID()
		} else {
			s := h.stream(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three", `"max_tokens":4`, `"stream":true`)})
			if s.resp.StatusCode != 200 {
				t.Fatalf("stream %d: %d", i, s.resp.StatusCode)
			}
			evs := s.all()
			if len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
				t.Fatalf("stream %d did not end with [DONE]: %v", i, evs)
			}
			id = s.resp.Header.Get(GenerationHeader)
		}
		// No waiting: the record is there, and the slot free, when the answer has ended.
		if ev, err := h.store.Generation(context.Background(), "org_one", id); err != nil || ev.Status != usage.StatusCompleted {
			t.Fatalf("request %d: generation %s right after its answer: %+v, %v", i, id, ev, err)
		}
		if held, err := h.store.InFlight(context.Background(), "org_one", time.Now()); err != nil || len(held) != 0 {
			t.Fatalf("request %d: in flight right after its answer: %v, %v", i, held, err)
		}
	}
}

// TestAnswerWithheldWithoutItsSettlement: while the store cannot take a settlement, no answer is
// given complete without its debit: a non-streamed answer becomes a 503 store_unavailable and is
// billed nothing, a stream ends with a store_unavailable event instead of [DONE] and is billed what
// it delivered, each once the store takes its settlement again.
func TestAnswerWithheldWithoutItsSettlement(t *testing.T) {
	t.Parallel()
	slow := &slowStore{}
	h := newHarness(t, config{
		gateway: func(o *Options) {
			o.SettleInBackground = true
			o.SettleWait = 200 * time.Millisecond
		},
		wrapStore: func(s store.Gateway) store.Gateway { slow.Gateway = s; return slow },
	})
	key, _ := h.newOrg("org_down", "1", 8)
	slow.failSettle.Store(true)

	r := h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`)})
	if r.status != 503 || deref(r.errorBody(t).Code) != "store_unavailable" {
		t.Fatalf("non-streamed answer while settlements fail: %d %s", r.status, r.body)
	}
	withheld := r.genID()

	s := h.stream(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`, `"stream":true`)})
	evs := s.all()
	last := evs[len(evs)-1].data
	if !strings.Contains(last, `"code":"store_unavailable"`) {
		t.Fatalf("stream while settlements fail ended with %q", last)
	}
	for _, ev := range evs {
		if ev.data == "[DONE]" {
			t.Fatal("a stream whose settlement did not commit sent [DONE]")
		}
	}
	streamed := s.resp.Header.Get(GenerationHeader)

	if err := h.drain(300 * time.Millisecond); err == nil {
		t.Fatal("Drain returned while two settlements waited for the store")
	}
	slow.failSettle.Store(false)
	if err := h.drain(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if ev, err := h.store.Generation(context.Background(), "org_down", withheld); err != nil || ev.Cost != 0 || ev.Status != usage.StatusRejected || ev.HTTPStatus != 503 {
		t.Errorf("the withheld answer's record: %+v, %v; want rejected, 503, free", ev, err)
	}
	ev, err := h.store.Generation(context.Background(), "org_down", streamed)
	if err != nil || ev.CompletionTokens != 12 || ev.Cost.String() != "0.000001155" {
		t.Errorf("the cut stream's record: %+v, %v; want its 12 delivered tokens billed", ev, err)
	}
	if got := h.balance("org_down").String(); got != "0.999998845" {
		t.Errorf("balance %s, want 1 − 0.000001155", got)
	}
}

// TestFenceStopsAStreamWhoseLeaseLapses: a stream whose lease cannot be renewed is stopped before
// the lease expires — it ends with a slot_lost event and is billed what it delivered — so that
// the organization never has more requests served than its limit, however long the store stalls.
// The gateway runs on a fake clock that the test moves to just before the fence and then onto
// it, so that the machine's load cannot make the fence look late.
func TestFenceStopsAStreamWhoseLeaseLapses(t *testing.T) {
	t.Parallel()
	const (
		ttl       = time.Minute
		every     = ttl / 3     // renewals
		fence     = ttl - ttl/6 // a sixth of the lease before it expires
		maxTokens = 100000      // 2,000 s at 20 ms a token: the fence ends it, not its length
	)
	clk := newFakeClock(time.Now())
	slow := &slowStore{}
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.Clock = clk; o.LeaseTTL = ttl },
		wrapStore: func(s store.Gateway) store.Gateway { slow.Gateway = s; return slow },
	})
	key, _ := h.newOrg("org_fence", "1", 1)
	slow.failRenew.Store(true)
	s := h.stream(req{path: "/v1/chat/completions", key: key,
		body: chatBody("gpt-oss-120b", "slow [[sim:delay_ms=20]]", `"max_tokens":`+strconv.Itoa(maxTokens), `"stream":true`)})
	began := clk.Now()
	var evs []event
	// readContent reads the stream until n more chunks of content arrived.
	readContent := func(n int) {
		t.Helper()
		for n > 0 {
			ev, err := s.next()
			if err != nil {
				t.Fatalf("stream ended after %d events: %v", len(evs), err)
			}
			if strings.Contains(ev.data, `"code":"slot_lost"`) {
				t.Fatalf("stream fenced %v into its lease, before its fence at %v", clk.Now().Sub(began), fence)
			}
			evs = append(evs, ev)
			if ev.comment == "" && parseChunk(t, ev.data).hasContent() {
				n--
			}
		}
	}
	clk.armedAt(t, fence)
	readContent(3)
	// Two renewals fail; the stream is still served a moment before the fence.
	for range 2 {
		clk.advance(every)
		clk.armedAt(t, every)
	}
	clk.advance(fence - 2*every - time.Millisecond)
	readContent(3)
	clk.advance(time.Millisecond)
	evs = append(evs, s.all()...)
	last := evs[len(evs)-1]
	if !strings.Contains(last.data, `"code":"slot_lost"`) {
		t.Fatalf("stream without renewals ended with %q", last.data)
	}
	content := 0
	for _, ev := range dataEvents(evs) {
		if parseChunk(t, ev.data).hasContent() {
			content++
		}
	}
	ev := h.waitEvent("org_fence", s.resp.Header.Get(GenerationHeader))
	if ev.Status != usage.StatusSlotLost || ev.CompletionTokens < int64(content) || ev.CompletionTokens >= maxTokens {
		t.Errorf("record of the fenced stream: %+v; want slot_lost, billed at least the %d chunks delivered", ev, content)
	}
	// It stopped before its lease expired, by the gateway's clock.
	if d := time.Duration(ev.DurationMillis) * time.Millisecond; d >= ttl {
		t.Errorf("the fenced stream ran %v, past its %v lease", d, ttl)
	}
	if held, err := h.store.InFlight(context.Background(), "org_fence", time.Now()); err != nil || len(held) != 0 {
		t.Errorf("in flight after the fenced stream: %v, %v", held, err)
	}
}

// TestAdmissionDeadline: an admission that the store cannot answer in time is a prompt 503
// store_unavailable, not a request held open.
func TestAdmissionDeadline(t *testing.T) {
	t.Parallel()
	slow := &slowStore{}
	h := newHarness(t, config{
		gateway:   func(o *Options) { o.AdmitTimeout = 200 * time.Millisecond },
		wrapStore: func(s store.Gateway) store.Gateway { slow.Gateway = s; return slow },
	})
	slow.stallAdmit.Store(true)
	r := h.chat(chatBody("qwen3-32b", "hi"))
	if r.status != 503 || deref(r.errorBody(t).Code) != "store_unavailable" || r.genID() != "" {
		t.Fatalf("admission on a stalled store: %d %s (generation id %q)", r.status, r.body, r.genID())
	}
	slow.stallAdmit.Store(false)
	if r := h.chat(chatBody("qwen3-32b", "hi [[sim:tokens=1]]")); r.status != 200 {
		t.Fatalf("after the stall: %d %s", r.status, r.body)
	}
}

// TestReservationRefusesWhatCannotFit: a request whose worst case does not fit what the
// organization has available is refused with 402 before it reaches a backend; the same request
// with a max_tokens that fits is served, and its reservation is back once it ended.
func TestReservationRefusesWhatCannotFit(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// gpt-oss-120b: 131072 tokens of context, $0.07 per 1M output tokens: without max_tokens the
	// worst case is 131072 × 0.07 / 1M = $0.00917504.
	key, _ := h.newOrg("org_small", "0.009", 8)
	before := h.rec.count()
	r := h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three")})
	if r.status != 402 || deref(r.errorBody(t).Code) != "insufficient_credits" || !strings.Contains(r.errorBody(t).Message, "0.00917504") {
		t.Fatalf("without max_tokens: %d %s", r.status, r.body)
	}
	if h.rec.count() != before {
		t.Error("a refused request reached the backend")
	}
	r = h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three", `"max_tokens":12`)})
	if r.status != 200 {
		t.Fatalf("with max_tokens 12: %d %s", r.status, r.body)
	}
	org, err := h.store.Org(context.Background(), "org_small")
	if err != nil || org.Reserved != 0 {
		t.Errorf("after the answer: %+v, %v; want nothing reserved", org, err)
	}
}

// TestRunningGenerationAnswersAtOnce: while a stream runs, GET /v1/generation of its id answers
// at once with in_progress for its own organization and 404 for another; once the stream ended,
// the record.
func TestRunningGenerationAnswersAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	otherKey, _ := h.newOrg("org_other_gen", "1", 8)
	s := h.stream(req{path: "/v1/chat/completions", key: h.key,
		body: chatBody("qwen3-32b", "slow [[sim:delay_ms=100]]", `"max_tokens":10`, `"stream":true`)})
	id := s.resp.Header.Get(GenerationHeader)
	if _, err := s.next(); err != nil {
		t.Fatal(err)
	}
	r := h.do(req{method: "GET", path: "/v1/generation?id=" + id, key: h.key})
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"in_progress"`) || !strings.Contains(string(r.body), `"object":"generation"`) {
		t.Fatalf("own running generation: %d %s", r.status, r.body)
	}
	if r := h.do(req{method: "GET", path: "/v1/generation?id=" + id, key: otherKey}); r.status != 404 {
		t.Fatalf("another organization's running generation: %d %s", r.status, r.body)
	}
	// Another gateway process on the same store learns it from the organization's lease map.
	other, err := New(Options{Store: h.store, Catalog: h.catalog, Upstream: upstream.New(h.catalog, upstream.Options{}), CacheTTL: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(other)
	defer srv.Close()
	base := h.base
	h.base = srv.URL
	r = h.do(req{method: "GET", path: "/v1/generation?id=" + id, key: h.key})
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"in_progress"`) {
		t.Fatalf("own running generation asked of another gateway: %d %s", r.status, r.body)
	}
	if r := h.do(req{method: "GET", path: "/v1/generation?id=" + id, key: otherKey}); r.status != 404 {
		t.Fatalf("another organization's running generation asked of another gateway: %d %s", r.status, r.body)
	}
	h.base = base
	s.all()
	r = h.do(req{method: "GET", path: "/v1/generation?id=" + id, key: h.key})
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"completed"`) {
		t.Fatalf("after the stream: %d %s", r.status, r.body)
	}
}

// TestWithheldAnswerBilledByALostTry: when the settlement try that the end of an answer gave up on
// had in fact committed (its answer was lost), the withheld answer's record keeps that bill and
// the gateway logs it as an error for a refund, rather than billing it silently or twice.
func TestWithheldAnswerBilledByALostTry(t *testing.T) {
	t.Parallel()
	slow := &slowStore{}
	var logs syncBuffer
	h := newHarness(t, config{
		gateway: func(o *Options) {
			o.SettleInBackground = true
			o.SettleWait = time.Millisecond // gives up after the first try
			o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		},
		wrapStore: func(s store.Gateway) store.Gateway { slow.Gateway = s; return slow },
	})
	key, _ := h.newOrg("org_lost", "1", 8)
	slow.lostAnswers.Store(1)
	r := h.do(req{path: "/v1/chat/completions", key: key, body: chatBody("gpt-oss-120b", "one two three four five six seven eight nine", `"max_tokens":12`)})
	if r.status != 503 {
		t.Fatalf("answer whose settlement's answer was lost: %d %s", r.status, r.body)
	}
	if err := h.drain(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := h.balance("org_lost").String(); got != "0.999998845" {
		t.Errorf("balance %s, want one debit of 0.000001155", got)
	}
	if !strings.Contains(logs.String(), "withheld answer was billed") || !strings.Contains(logs.String(), r.genID()) {
		t.Errorf("no refund line naming %s in the log:\n%s", r.genID(), logs.String())
	}
}
