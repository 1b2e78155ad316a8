package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rawExchange writes raw to a new connection to the server, optionally waits, and reads the one
// answer the server gives, if any, until it closes the connection. The deadline is a hang guard.
func rawExchange(t *testing.T, base string, raw string, guard time.Duration) (*http.Response, []byte, time.Duration) {
	t.Helper()
	u, _ := url.Parse(base)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(guard))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, time.Since(start)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The server closes the connection after each of these answers.
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("the connection stayed open after %d (%v)", resp.StatusCode, err)
	}
	return resp, body, time.Since(start)
}

func errorCode(t *testing.T, resp *http.Response, body []byte) string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%d: Content-Type %q, body %q", resp.StatusCode, ct, body)
	}
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type != "invalid_request_error" || e.Error.Code == nil {
		t.Fatalf("%d: not the error shape: %q (%v)", resp.StatusCode, body, err)
	}
	return *e.Error.Code
}

// TestConnectionErrorsAreJSON sends what net/http refuses before any handler runs, and requests
// that stall: each gets the API's JSON error and the connection is closed, key or no key.
func TestConnectionErrorsAreJSON(t *testing.T) {
	l := startLocal(t, map[string]string{"KILN_HEADER_TIMEOUT": "700ms", "KILN_BODY_TIMEOUT": "700ms", "KILN_IDLE_TIMEOUT": "700ms"})
	// What is refused rather than timed out goes to a gateway whose timeouts a loaded machine
	// cannot reach while it reads 96 KB of headers.
	patient := startLocal(t, map[string]string{"KILN_HEADER_TIMEOUT": "30s", "KILN_BODY_TIMEOUT": "30s", "KILN_IDLE_TIMEOUT": "30s"})
	post := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct {
		name   string
		raw    string
		status int
		code   string
	}{
		{"headers over 64 KiB", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 80<<10) + "\r\n\r\n", 431, "request_header_fields_too_large"},
		{"many headers", "GET /v1/models HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-A: b\r\n", 12000) + "\r\n", 431, "request_header_fields_too_large"},
		{"malformed request line", "GARBAGE\r\n\r\n", 400, "malformed_request"},
		{"NUL in a header", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400, "malformed_request"},
		{"no Host", "GET /v1/models HTTP/1.1\r\n\r\n", 400, "malformed_request"},
		{"unknown transfer coding", post + "Transfer-Encoding: gzip\r\n\r\n", 400, "unsupported_transfer_encoding"},
		{"HTTP/2.0 on an HTTP/1 request line", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 400, "http_version_not_supported"},
		{"headers that stall", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", 408, "request_timeout"},
		{"nothing at all", "", 408, "request_timeout"},
		{"a body that stalls, no key", post + "Content-Length: 1000\r\n\r\n{\"model\":", 408, "request_timeout"},
		{"a body that stalls, with a key", post + "Authorization: Bearer " + l.key + "\r\nContent-Length: 1000\r\n\r\n{\"model\":", 408, "request_timeout"},
		{"a chunked body that stalls", post + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n", 408, "request_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := patient.base
			if tc.status == http.StatusRequestTimeout {
				base = l.base
			}
			resp, body, took := rawExchange(t, base, tc.raw, 30*time.Second)
			if resp == nil {
				t.Fatalf("no answer after %v", took)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %q", resp.StatusCode, tc.status, body)
			}
			if code := errorCode(t, resp, body); code != tc.code {
				t.Errorf("code %q, want %q", code, tc.code)
			}
		})
	}

	t.Run("an idle kept-alive connection is closed without an answer", func(t *testing.T) {
		u, _ := url.Parse(l.base)
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if b, err := br.ReadByte(); err != io.EOF {
			t.Errorf("after the idle timeout: %q, %v; want the connection closed", b, err)
		}
	})

	t.Run("a stream outlives the body timeout", func(t *testing.T) {
		// The body's deadline is cleared once it is read: net/http's watch for the client leaving
		// must not see it pass in the middle of a stream (or of a kept-alive connection's next one).
		for range 2 {
			req, _ := http.NewRequest(http.MethodPost, l.base+"/chat/completions", strings.NewReader(
				`{"model":"qwen3-32b","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"slow [[sim:delay_ms=250]]"}]}`))
			req.Header.Set("Authorization", "Bearer "+l.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("%d %v: %q", resp.StatusCode, err, b)
			}
		}
	})

	t.Run("a request that is not slow passes", func(t *testing.T) {
		body := `{"model":"qwen3-32b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
		resp, _, _ := rawExchange(t, l.base, post+"Authorization: Bearer "+l.key+"\r\nConnection: close\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body, 30*time.Second)
		if resp == nil || resp.StatusCode != 200 {
			t.Fatalf("%v", resp)
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }
