package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
)

// closedURL returns a base URL on which nothing listens.
func closedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/v1"
}

func model(backends ...catalog.Backend) *catalog.Catalog {
	m := &catalog.Model{ID: "m", Backends: backends}
	for i := range m.Backends {
		if m.Backends[i].Model == "" {
			m.Backends[i].Model = "m"
		}
	}
	return &catalog.Catalog{Version: 1, Models: []*catalog.Model{m}}
}

func body(catalog.Backend) []byte { return []byte(`{"model":"m"}`) }

// healthy reports whether the named backend's breaker would let a request through at now,
// without taking a half-open trial.
func (p *Pool) healthy(name string, now time.Time) bool {
	be := p.backends[name]
	if be == nil {
		return false
	}
	b := &be.breaker
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.openUntil.IsZero() || (!now.Before(b.openUntil) && !b.trial)
}

type clock struct{ t atomic.Pointer[time.Time] }

func newClock() *clock               { c := &clock{}; now := time.Unix(1_800_000_000, 0); c.t.Store(&now); return c }
func (c *clock) Now() time.Time      { return *c.t.Load() }
func (c *clock) Add(d time.Duration) { n := c.Now().Add(d); c.t.Store(&n) }

func counting(status int, hits *atomic.Int64) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
	}))
}

func TestRetriesOnAnotherBackendOnlyWhenNothingWasSent(t *testing.T) {
	var hits atomic.Int64
	good := counting(200, &hits)
	defer good.Close()
	c := model(catalog.Backend{Name: "dead", URL: closedURL(t)}, catalog.Backend{Name: "good", URL: good.URL + "/v1"})
	p := New(c, Options{})
	for i := range 6 { // round robin starts on each backend in turn
		resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/chat/completions", Body: body, OrgID: "org_a"})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.Backend.Name != "good" {
			t.Fatalf("answered by %s", resp.Backend.Name)
		}
	}
	if hits.Load() != 6 {
		t.Errorf("good backend saw %d requests, want 6", hits.Load())
	}

	// A backend that received the request and then failed is not retried elsewhere.
	var hitsA, hitsB atomic.Int64
	reset := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsA.Add(1)
		panic(http.ErrAbortHandler) // the connection is cut after the request arrived
	}))
	defer reset.Close()
	other := counting(200, &hitsB)
	defer other.Close()
	c = model(catalog.Backend{Name: "reset", URL: reset.URL + "/v1"}, catalog.Backend{Name: "other", URL: other.URL + "/v1"})
	p = New(c, Options{})
	var failures int
	for range 4 {
		resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/chat/completions", Body: body, OrgID: "org_a"})
		if err != nil {
			failures++
			continue
		}
		resp.Body.Close()
	}
	if failures != 2 || hitsA.Load() != 2 || hitsB.Load() != 2 {
		t.Errorf("failures %d, reset backend hits %d, other %d; want 2, 2, 2 (no retry after sending)", failures, hitsA.Load(), hitsB.Load())
	}
}

func TestBreakerOpensAndRecovers(t *testing.T) {
	var hits atomic.Int64
	status := atomic.Int64{}
	status.Store(503)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	clk := newClock()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
	p := New(c, Options{FailureThreshold: 3, OpenFor: 5 * time.Second, Now: clk.Now})
	do := func() (*Response, error) {
		resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"})
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	for range 3 {
		if resp, err := do(); err != nil || resp.StatusCode != 503 {
			t.Fatalf("want the 503 through: %v", err)
		}
	}
	if _, err := do(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after 3 failures: %v, want ErrUnavailable", err)
	}
	if hits.Load() != 3 {
		t.Fatalf("an open breaker let a request through (%d hits)", hits.Load())
	}
	clk.Add(5 * time.Second)
	// Half-open: one trial. It fails, so the breaker opens again.
	if resp, err := do(); err != nil || resp.StatusCode != 503 {
		t.Fatalf("trial: %v", err)
	}
	if _, err := do(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after a failed trial: %v", err)
	}
	clk.Add(5 * time.Second)
	status.Store(200)
	if resp, err := do(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("second trial: %v", err)
	}
	for range 5 {
		if resp, err := do(); err != nil || resp.StatusCode != 200 {
			t.Fatalf("closed again: %v", err)
		}
	}
	if !p.healthy("b", clk.Now()) {
		t.Error("Healthy = false after recovery")
	}
}

// TestBreakerIsTenantSafe checks contract section 3: one organization's requests that draw
// error statuses never make a backend unavailable to another organization, while failures that
// say the backend itself is unhealthy (refused connections, 503) open it for everyone, and 500s
// that two organizations draw open it too.
func TestBreakerIsTenantSafe(t *testing.T) {
	// The backend answers a request with the status its body names: {"status":500}.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var status int
		if _, err := fmt.Sscanf(string(b), `{"status":%d}`, &status); err != nil || status == 0 {
			status = 200
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	dead := closedURL(t)

	type step struct {
		org    string
		status int  // what the body asks for; 0: a plain 200
		want   int  // the status the caller gets; 0: ErrUnavailable
		dead   bool // the request goes to the dead backend's model
	}
	a500 := step{org: "org_a", status: 500, want: 500}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"one organization's 500s leave the backend to the others", []step{
			a500, a500, a500, a500, a500, a500,
			{org: "org_b", want: 200},
			a500, a500, a500,
			{org: "org_b", want: 200},
		}},
		{"one organization's 429s likewise", []step{
			{org: "org_a", status: 429, want: 429}, {org: "org_a", status: 429, want: 429}, {org: "org_a", status: 429, want: 429}, {org: "org_a", status: 429, want: 429},
			{org: "org_b", want: 200},
		}},
		{"501 is an answer, not a failure", []step{
			{org: "org_a", status: 501, want: 501}, {org: "org_a", status: 501, want: 501}, {org: "org_a", status: 503, want: 503},
			{org: "org_a", status: 503, want: 503}, {org: "org_b", want: 200},
		}},
		{"500s that two organizations draw open it", []step{
			a500, a500, {org: "org_b", status: 500, want: 500},
			{org: "org_c", want: 0},
		}},
		{"503s open it for everyone, whoever drew them", []step{
			{org: "org_a", status: 503, want: 503}, {org: "org_a", status: 503, want: 503}, {org: "org_a", status: 503, want: 503},
			{org: "org_b", want: 0},
		}},
		{"a dead backend is refused quickly for everyone", []step{
			{org: "org_a", dead: true, want: -1}, {org: "org_a", dead: true, want: -1}, {org: "org_a", dead: true, want: -1},
			{org: "org_b", dead: true, want: 0}, {org: "org_c", dead: true, want: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			c := &catalog.Catalog{Version: 1, Models: []*catalog.Model{
				{ID: "m", Backends: []catalog.Backend{{Name: "b", URL: srv.URL + "/v1", Model: "m"}}},
				{ID: "dead", Backends: []catalog.Backend{{Name: "d", URL: dead, Model: "dead"}}},
			}}
			p := New(c, Options{FailureThreshold: 3, OpenFor: 5 * time.Second, Now: clk.Now})
			for i, st := range tc.steps {
				m := c.Models[0]
				if st.dead {
					m = c.Models[1]
				}
				payload := []byte(fmt.Sprintf(`{"status":%d}`, st.status))
				resp, err := p.Do(context.Background(), Call{Model: m, Path: "/x", Body: func(catalog.Backend) []byte { return payload }, OrgID: st.org})
				switch {
				case st.want == 0:
					if !errors.Is(err, ErrUnavailable) {
						t.Fatalf("step %d (%s): %v, want ErrUnavailable", i, st.org, err)
					}
				case st.want == -1:
					var ue *Error
					if !errors.As(err, &ue) {
						t.Fatalf("step %d (%s): %v, want a connection error", i, st.org, err)
					}
				default:
					if err != nil {
						t.Fatalf("step %d (%s): %v, want status %d", i, st.org, err, st.want)
					}
					resp.Body.Close()
					if resp.StatusCode != st.want {
						t.Fatalf("step %d (%s): status %d, want %d", i, st.org, resp.StatusCode, st.want)
					}
				}
			}
		})
	}
}

// TestBreakerTrialNeedsFreshEvidence checks that once open, a trial that one organization's
// request fails with a 500 does not shut the backend again for the others: the next request
// gets a trial of its own.
func TestBreakerTrialNeedsFreshEvidence(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) == "fail" {
			w.WriteHeader(500)
			return
		}
		w.WriteHeader(200)
	}))
	defer srv.Close()
	clk := newClock()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
	p := New(c, Options{FailureThreshold: 2, OpenFor: 5 * time.Second, Now: clk.Now})
	do := func(org, payload string) (int, error) {
		resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: func(catalog.Backend) []byte { return []byte(payload) }, OrgID: org})
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	_, _ = do("org_a", "fail")
	_, _ = do("org_b", "fail")
	if _, err := do("org_c", "ok"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after 500s from two organizations: %v, want ErrUnavailable", err)
	}
	clk.Add(5 * time.Second)
	if s, err := do("org_a", "fail"); err != nil || s != 500 {
		t.Fatalf("trial: %d %v", s, err)
	}
	if s, err := do("org_c", "ok"); err != nil || s != 200 {
		t.Fatalf("after org_a's failed trial: %d %v, want org_c served", s, err)
	}
}

func TestAbandonedTrialDoesNotWedgeTheBreaker(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-block:
		case <-r.Context().Done():
		}
		w.WriteHeader(200)
	}))
	defer srv.Close()
	defer close(block)
	clk := newClock()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
	p := New(c, Options{FailureThreshold: 1, Now: clk.Now})
	be := p.backends["b"]
	be.breaker.failure(clk.Now(), p.opt, failureUnhealthy, "")
	clk.Add(p.opt.OpenFor)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Do(ctx, Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"}); err == nil {
		t.Fatal("want the caller's timeout")
	}
	if !p.healthy("b", clk.Now()) {
		t.Error("a trial whose caller left keeps the breaker half-open forever")
	}
}

func TestHeaderTimeoutAndCancellation(t *testing.T) {
	gotCancel := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // net/http notices a closed client only once the body is read
		select {
		case <-r.Context().Done():
			gotCancel <- struct{}{}
		case <-time.After(10 * time.Second):
		}
	}))
	defer srv.Close()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
	p := New(c, Options{HeaderTimeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"})
	var ue *Error
	if !errors.As(err, &ue) || ue.Backend != "b" {
		t.Fatalf("want a backend error, got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("header timeout not applied")
	}
	select {
	case <-gotCancel:
	case <-time.After(5 * time.Second):
		t.Fatal("the backend never saw the request end")
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	p = New(c, Options{})
	if _, err := p.Do(ctx, Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	select {
	case <-gotCancel:
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the caller did not cancel the backend request")
	}
}

func TestBackendAuthorizationFromEnvironment(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
	}))
	defer srv.Close()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1", APIKeyEnv: "B_KEY"})
	p := New(c, Options{Getenv: func(k string) string { return map[string]string{"B_KEY": "s3cret"}[k] }})
	resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if a := <-got; a != "Bearer s3cret" {
		t.Errorf("Authorization = %q", a)
	}
}

// A base with an empty port is sent as http.NewRequest sends it: the Host header names no port.
func TestEmptyPortIsTheSchemes(t *testing.T) {
	for raw, host := range map[string]string{"http://h:/v1": "h", "https://[::1]:/v1": "[::1]", "http://h:8000/v1": "h:8000"} {
		p := New(model(catalog.Backend{Name: "b", URL: raw}), Options{})
		if got := p.backends["b"].base.Host; got != host {
			t.Errorf("%s: host %q, want %q", raw, got, host)
		}
		want, _ := http.NewRequest(http.MethodPost, raw, nil)
		if want.Host != host {
			t.Errorf("%s: http.NewRequest's host %q, want %q", raw, want.Host, host)
		}
	}
}

func TestRequestBodyIsSentWholeAndThenForgotten(t *testing.T) {
	got := make(chan []byte, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
	})
	plain, tls := httptest.NewServer(h), httptest.NewTLSServer(h)
	defer plain.Close()
	defer tls.Close()
	for _, srv := range []*httptest.Server{plain, tls} {
		c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
		p := New(c, Options{})
		if tr := p.backends["b"].transport; tr != nil {
			tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
		}
		for _, size := range []int{1, 300, 4 << 10, 5 << 20} {
			sent := bytes.Repeat([]byte{'x'}, size)
			resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: func(catalog.Backend) []byte { return sent }, OrgID: "org_a"})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if b := <-got; !bytes.Equal(b, sent) {
				t.Fatalf("%s: %d bytes sent, %d received", srv.URL, size, len(b))
			}
			// (Over pooled connections nothing keeps the request once it is written.)
			if resp.Request != nil {
				if _, err := resp.Request.GetBody(); err == nil {
					t.Error("the body can still be had again after the response arrived")
				}
			}
		}
	}

	r := &requestBody{full: []byte("abc")}
	if b, err := io.ReadAll(r.reader()); err != nil || string(b) != "abc" {
		t.Errorf("read %q, %v", b, err)
	}
	r.written(httptrace.WroteRequestInfo{})
	if n := r.cur.Load().Size(); n != 0 {
		t.Errorf("the copy sent still holds %d bytes once written", n)
	}
	again, err := r.again()
	// A first attempt's writer may report only now, after the retry began (HTTP/2): the
	// retry's copy must not be emptied under it.
	r.written(httptrace.WroteRequestInfo{})
	if b, _ := io.ReadAll(again); err != nil || string(b) != "abc" {
		t.Errorf("again: %q, %v", b, err)
	}
}

// TestRequestSentInOneWrite: the header lines and a body of a few hundred bytes leave in one
// write, so that the backend's first read has the whole request. (A body the transport does not
// know to be in memory has its header lines flushed first, alone; a write buffer too small for
// both splits them too.)
func TestRequestSentInOneWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	first := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 64<<10)
		n, _ := conn.Read(buf)
		first <- buf[:n]
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	}()
	c := model(catalog.Backend{Name: "b", URL: "http://" + ln.Addr().String() + "/v1"})
	p := New(c, Options{})
	sent := append([]byte(`{"model":"m","messages":[{"role":"user","content":"`), bytes.Repeat([]byte{'x'}, 300)...)
	sent = append(sent, `"}]}`...)
	resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: func(catalog.Backend) []byte { return sent }, OrgID: "org_a"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := <-first; !bytes.HasSuffix(got, sent) {
		t.Errorf("the backend's first read has %d bytes, not the whole request:\n%s", len(got), got)
	}
}

// TestRedirectIsTheAnswer: a backend's redirect is returned as its answer, not followed: a model
// server that redirects is misconfigured, and following would send the body a second time.
func TestRedirectIsTheAnswer(t *testing.T) {
	followed := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/x", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/v1/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/v1/elsewhere", func(w http.ResponseWriter, r *http.Request) { followed <- struct{}{} })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := model(catalog.Backend{Name: "b", URL: srv.URL + "/v1"})
	p := New(c, Options{})
	resp, err := p.Do(context.Background(), Call{Model: c.Models[0], Path: "/x", Body: body, OrgID: "org_a"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("status %d, want the backend's 307", resp.StatusCode)
	}
	select {
	case <-followed:
		t.Error("the redirect was followed")
	default:
	}
}
