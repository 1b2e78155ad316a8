package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

// FuzzRequest feeds whole HTTP requests, as bytes, to the local server (Run: the gateway behind
// its listener, the embedded store, the model simulator) over a loopback socket, and checks what
// must hold whatever a client sends: an answer or a closed connection within the hang guard; no
// 5xx but a backend's (502, or 503 backend_unavailable, once a request asked the simulator to fail);
// every error but the plain-text 502 in the JSON error shape; every generation id an answer names
// settled, its event's cost its one debit; the organization's slots back to zero after each input;
// and, when the fuzzing ends, no debit without its event. "$KEY" in an input is the demo key.
//
// The seeds below run with go test (and so make test); make fuzz runs the target longer.
func FuzzRequest(f *testing.F) {
	l := startLocal(f, map[string]string{
		// Short, so that stalls and kept-alive connections end quickly: the server closes every
		// connection soon after its last answer, which is how an input's end is found.
		"KILN_HEADER_TIMEOUT": "300ms", "KILN_BODY_TIMEOUT": "300ms", "KILN_IDLE_TIMEOUT": "300ms",
		"KILN_DEMO_CREDITS": "1000.00",
	})
	st, err := sqlite.Open(l.cfg.DataDir, sqlite.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	u, _ := url.Parse(l.base)
	fz := &requestFuzz{addr: u.Host, key: l.key, st: st}
	f.Cleanup(func() { fz.noDebitWithoutEvent(f) })

	for _, seed := range requestSeeds() {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		// Directives that only make the simulator slow would only make the input slow.
		if bytes.Contains(raw, []byte("delay_ms")) || bytes.Contains(raw, []byte("first_byte_ms")) {
			t.Skip("a slow simulator directive")
		}
		fz.run(t, bytes.ReplaceAll(raw, []byte("$KEY"), []byte(fz.key)))
	})
}

type requestFuzz struct {
	addr, key string
	st        store.Store

	mu     sync.Mutex
	faults bool // an input asked the simulator to fail: a breaker may be open for a while
}

const fuzzHangGuard = 60 * time.Second

func (fz *requestFuzz) run(t *testing.T, raw []byte) {
	if bytes.Contains(raw, []byte("[[sim:")) {
		fz.mu.Lock()
		fz.faults = true
		fz.mu.Unlock()
	}
	c, err := net.Dial("tcp", fz.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(fuzzHangGuard))
	// Written from another goroutine: the server may answer (431, 408) before it has read it all.
	go func() { _, _ = c.Write(raw) }()
	br := bufio.NewReader(c)
	var genIDs []string
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("neither an answer nor a closed connection within %v", fuzzHangGuard)
			}
			break // the server closed the connection (after an error, or when it went idle)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("an answer's body did not end within %v", fuzzHangGuard)
		}
		fz.checkAnswer(t, resp, body)
		if id := resp.Header.Get("X-Neocloud-Generation-Id"); id != "" {
			genIDs = append(genIDs, id)
		}
	}
	for _, id := range genIDs {
		fz.checkSettled(t, id)
	}
	fz.checkIdle(t)
}

func (fz *requestFuzz) checkAnswer(t *testing.T, resp *http.Response, body []byte) {
	t.Helper()
	s, ct := resp.StatusCode, resp.Header.Get("Content-Type")
	fz.mu.Lock()
	faults := fz.faults
	fz.mu.Unlock()
	switch {
	case s == 502 && faults:
		return // the simulator's, as asked
	case s == 503 && faults && bytes.Contains(body, []byte(`"backend_unavailable"`)):
		return // a breaker the asked-for failures opened
	case s >= 500:
		t.Fatalf("%d from the gateway itself: %q", s, clipBody(body))
	case s != 200 && !strings.HasPrefix(ct, "application/json"):
		t.Fatalf("a %d that is not JSON (%q): %q", s, ct, clipBody(body))
	case s != 200 && !bytes.HasPrefix(body, []byte(`{"error":{`)):
		t.Fatalf("a %d not in the error shape: %q", s, clipBody(body))
	case len(body) > 64<<10 && s != 200:
		t.Fatalf("a %d of %d bytes", s, len(body))
	}
}

// checkSettled waits for the generation's event and checks its debit.
func (fz *requestFuzz) checkSettled(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ev, err := fz.st.Generation(ctx, demoOrgID, id)
		if err == nil {
			entries, err := fz.st.Ledger(ctx, demoOrgID)
			if err != nil {
				t.Fatal(err)
			}
			var debits []store.LedgerEntry
			for _, e := range entries {
				if e.Kind == store.EntryDebit && e.ID == id {
					debits = append(debits, e)
				}
			}
			switch {
			case len(debits) > 1:
				t.Fatalf("%s debited %d times", id, len(debits))
			case len(debits) == 1 && debits[0].Amount != -ev.Cost:
				t.Fatalf("%s debited %s, its event costs %s", id, debits[0].Amount, ev.Cost)
			case len(debits) == 0 && ev.Cost != 0:
				t.Fatalf("%s costs %s and was not debited", id, ev.Cost)
			case len(ev.Model) > 256 || ev.DurationMillis < ev.TTFTMillis:
				t.Fatalf("%s: model of %d bytes, duration %d below ttft %d", id, len(ev.Model), ev.DurationMillis, ev.TTFTMillis)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s named by an answer has no event: %v", id, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkIdle waits until the organization holds no slot (the store shows the gateway's copy of
// its slots, a commit behind).
func (fz *requestFuzz) checkIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		held, err := fz.st.InFlight(context.Background(), demoOrgID, time.Now())
		if err == nil && len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still held (%v)", len(held), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noDebitWithoutEvent checks the whole ledger once the fuzzing is over.
func (fz *requestFuzz) noDebitWithoutEvent(t testing.TB) {
	ctx := context.Background()
	entries, err := fz.st.Ledger(ctx, demoOrgID)
	if err != nil {
		t.Error(err)
		return
	}
	for _, e := range entries {
		if e.Kind != store.EntryDebit {
			continue
		}
		if ev, err := fz.st.Generation(ctx, demoOrgID, e.ID); err != nil || ev.Cost != -e.Amount {
			t.Errorf("debit %s of %s: its event %+v, %v", e.ID, e.Amount, ev, err)
		}
	}
}

func clipBody(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// requestSeeds are whole requests: well-formed ones of each kind, and the hostile inputs of
// tests/reliability's suite in miniature.
func requestSeeds() []string {
	post := func(path, body string, headers ...string) string {
		h := "POST " + path + " HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer $KEY\r\nContent-Type: application/json\r\n"
		for _, x := range headers {
			h += x + "\r\n"
		}
		return h + "Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body
	}
	chat := func(body string) string { return post("/v1/chat/completions", body) }
	hi := `"messages":[{"role":"user","content":"hi"}]`
	return []string{
		chat(`{"model":"qwen3-32b",` + hi + `,"max_tokens":3}`),
		chat(`{"model":"gpt-oss-120b",` + hi + `,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`),
		post("/v1/completions", `{"model":"qwen3-32b","prompt":"once","max_tokens":2,"stream":"true"}`),
		chat(`{"model":"qwen3-32b",`+hi+`,"max_tokens":2}`) + chat(`{"model":"gpt-oss-120b",`+hi+`,"max_tokens":2}`),
		"GET /v1/models HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer $KEY\r\n\r\n",
		"GET /v1/generation?id=gen-01ARZ3NDEKTSV4RRFFQ69G5FAV HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer $KEY\r\n\r\n",
		"GET /v1/credits HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer $KEY\r\n\r\n",
		chat(`{"model":"` + strings.Repeat("m", 2000) + `",` + hi + `}`),
		chat(`{"model":"=HYPERLINK(\"http://x\",\"y\")",` + hi + `}`),
		chat(`{"model":"gpt-oss-120b",` + hi + `,"ignore_eos":"true"}`),
		chat(`{"model":"qwen3-32b","messages":[{"role":"user","content":[{"type":"image_url","type":"image_url","image_url":{"url":"http://x"}}]}]}`),
		chat(`{"model":"qwen3-32b","messages":[{"role":"user","role":"system","content":"hi"}]}`),
		chat(`{"model":"qwen3-32b",` + hi + `,"x":` + strings.Repeat("[", 1001) + strings.Repeat("]", 1001) + `}`),
		chat("{\"model\":\"qwen3-32b\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\\ud800\\u0000\"}],\"max_tokens\":1}"),
		chat(`{"model":"qwen3-32b",` + hi + `,"max_tokens":1e400}`),
		chat(`{"model":"qwen3-32b","messages":[{"role":"user","content":"[[sim:status=500]]"}]}`),
		chat(`{"model":"gpt-oss-120b","messages":[{"role":"user","content":"[[sim:drop_after=1]]"}],"stream":true,"max_tokens":4}`),
		chat(`{"model":"qwen3-32b",` + hi + `}`)[:60],
		"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Length: 1000\r\n\r\n{\"model\":1",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer $KEY\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"mo\r\nzz\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: g\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
		"GARBAGE\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: g\r\nX-A: a\x00b\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer nope\r\nContent-Length: 2\r\n\r\n{}",
		post("/v1/chat/completions", `{"model":"qwen3-32b",`+hi+`}`, "Authorization: Bearer $KEY"),
		"",
	}
}
