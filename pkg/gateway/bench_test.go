package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// benchPost sends body to url and drains the answer; it fails the benchmark on a non-200.
func benchPost(b *testing.B, client *http.Client, url, key, body string) int64 {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	return n
}

// BenchmarkChat is one non-streaming chat completion of 16 tokens, through the gateway
// (authentication, admission, forwarding, settlement in SQLite) and to the simulator directly.
func BenchmarkChat(b *testing.B) {
	h := newHarness(b)
	h.rec.off.Store(true)
	key, _ := h.newOrg("org_bench", "1000", 64)
	const content = "Answer briefly. Hello there, how are you today? [[sim:tokens=16]]"
	b.Run("gateway", func(b *testing.B) {
		body := chatBody("qwen3-32b", content, `"max_tokens":64`)
		b.ReportAllocs()
		for b.Loop() {
			benchPost(b, h.client, h.base+"/v1/chat/completions", key, body)
		}
	})
	b.Run("simulator", func(b *testing.B) {
		body := chatBody("Qwen/Qwen3-32B", content, `"max_tokens":64`)
		b.ReportAllocs()
		for b.Loop() {
			benchPost(b, h.client, h.simURL+"/chat/completions", "", body)
		}
	})
}

// BenchmarkStreamChunk streams with no delay, through the gateway and from the simulator
// directly, and reports the time per chunk.
//
// The simulator is sent the very body the gateway forwards to it: the gateway adds
// include_usage and continuous_usage_stats (usage on every chunk) to stream_options, and a
// direct request without them would spare the simulator that work, which would then be counted
// as the relay's.
//
// Each runs at 1,000 tokens and at 16. What is done once per request (authentication,
// admission, settlement) is in both, so (cost at 1,000 − cost at 16) / 984 is the cost of one
// more chunk, and the gateway's minus the simulator's is what the relay adds per chunk
// (tests/bench computes it).
func BenchmarkStreamChunk(b *testing.B) {
	h := newHarness(b, config{gateway: func(o *Options) { o.Keepalive = time.Minute }})
	key, _ := h.newOrg("org_bench", "1000", 64)
	for _, tokens := range []int{1000, 16} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			marker := fmt.Sprintf("stream %d tokens please", tokens)
			body := chatBody("qwen3-32b", marker, fmt.Sprintf(`"max_tokens":%d`, tokens), `"stream":true`, `"stream_options":{"include_usage":true}`)
			// One request through the gateway, recorded at the simulator: its body is what the
			// simulator is sent when called directly.
			h.rec.off.Store(false)
			wholeStream(b, h, h.base+"/v1/chat/completions", key, body, tokens)
			fwd, _ := h.rec.find(b, marker)
			h.rec.off.Store(true)
			for _, tc := range []struct{ name, url, key, body string }{
				{"gateway", h.base + "/v1/chat/completions", key, body},
				{"simulator", h.simURL + "/chat/completions", "", string(fwd.Body)},
			} {
				b.Run(tc.name, func(b *testing.B) {
					wholeStream(b, h, tc.url, tc.key, tc.body, tokens)
					b.ReportAllocs()
					start := time.Now()
					var n int64
					for b.Loop() {
						n += benchPost(b, h.client, tc.url, tc.key, tc.body)
					}
					b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*tokens), "ns/chunk")
					b.SetBytes(n / int64(b.N))
				})
			}
		})
	}
}

// wholeStream sends one streaming request and fails the benchmark unless the stream carries at
// least tokens events and ends with [DONE].
func wholeStream(b *testing.B, h *harness, url, key, body string, tokens int) {
	b.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	events := 0
	sc := bufio.NewScanner(resp.Body)
	var last string
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("data: ")) {
			events++
			last = sc.Text()
		}
	}
	if events < tokens || last != "data: [DONE]" {
		b.Fatalf("%s: %d events, last %q", url, events, last)
	}
}

// BenchmarkRewrite is the request path's body work: parse and check a chat request, then build
// the body forwarded to the backend.
func BenchmarkRewrite(b *testing.B) {
	h := newHarness(b)
	qwen, _ := h.catalog.Model("qwen3-32b")
	backend := qwen.Backends[0]
	tools := `"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather of a city.","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}}}]`
	msgs := `{"model":"qwen3-32b","messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly."},` +
		`{"role":"user","content":"` + strings.Repeat("What is the weather like in Paris today? ", 10) + `"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"{\"temp\":21}"}],` + tools + `,"temperature":0.7,"max_tokens":800`
	for _, tc := range []struct{ name, body string }{
		{"non-streaming", msgs + `}`},
		{"streaming", msgs + `,"stream":true,"stream_options":{"include_usage":false}}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req, _, e := h.gw.check(chatEndpoint, body)
				if e != nil {
					b.Fatal(e)
				}
				if out := req.forward(backend); len(out) == 0 {
					b.Fatal("empty body")
				}
			}
		})
	}
}

// BenchmarkRelayChunk is the relay's work on one content chunk as the simulator sends it behind
// the gateway (usage on every chunk, the backend's model id): parse, inspect the choice, drop
// the usage, restore the public model id. The system calls around it are in BenchmarkStreamChunk.
func BenchmarkRelayChunk(b *testing.B) {
	h := newHarness(b)
	qwen, _ := h.catalog.Model("qwen3-32b")
	data := []byte(`{"id":"chatcmpl-6f0c1e9b2a7d4c3e8f5a1b2c3d4e5f60","object":"chat.completion.chunk","created":1764450000,"model":"Qwen/Qwen3-32B","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":31,"total_tokens":43,"completion_tokens":12}}`)
	x := &exchange{g: h.gw, req: &request{model: qwen, stream: true}}
	x.meter.exactPerChunk = true // qwen3-32b's backend streams continuous usage
	r := &relayState{x: x, rename: true, modelJSON: []byte(`"qwen3-32b"`)}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		out, err := r.chunk(data)
		if err != nil || len(out) == 0 || !r.content {
			b.Fatalf("%q, %v", out, err)
		}
	}
}
