package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/upstream"
)

// TestForwardedBody checks section 4's rewriting as the backend receives it: every byte the
// gateway does not own arrives as the client wrote it.
func TestForwardedBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const odd = `"x_custom": {"a":[1,2.50]}, "temperature": 0.70,"seed": 12345678901234567890 ,"top_p":1e-1,"logit_bias":{"50256":-100},"note":"caf\u00e9 \"q\""`
	tests := []struct {
		name string
		path string
		body string
		want string // the exact forwarded body
	}{
		{
			name: "chat, qwen3-32b renamed",
			path: "/v1/chat/completions",
			body: `{ ` + odd + `, "model":"qwen3-32b", "messages":[{"role":"user","content":"R1 [[sim:tokens=1]]"}] }`,
			want: `{ ` + odd + `, "model":"Qwen/Qwen3-32B", "messages":[{"role":"user","content":"R1 [[sim:tokens=1]]"}] }`,
		},
		{
			name: "completions, gpt-oss renamed, stream false",
			path: "/v1/completions",
			body: `{"model" : "gpt-oss-120b",` + odd + `,"prompt":"R2 [[sim:tokens=1]]","stream":"false","ignore_eos":true}`,
			want: `{"model" : "openai/gpt-oss-120b",` + odd + `,"prompt":"R2 [[sim:tokens=1]]","stream":false,"ignore_eos":true}`,
		},
		{
			name: "stream 0 becomes false",
			path: "/v1/completions",
			body: `{"stream":0,"model":"gpt-oss-120b","prompt":"R3 [[sim:tokens=1]]"}`,
			want: `{"stream":false,"model":"openai/gpt-oss-120b","prompt":"R3 [[sim:tokens=1]]"}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(req{path: tc.path, body: tc.body, key: h.key})
			if r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			marker := tc.body[strings.Index(tc.body, "[[sim:")-3 : strings.Index(tc.body, "[[sim:")]
			fw, _ := h.rec.find(t, marker)
			if string(fw.Body) != tc.want {
				t.Errorf("forwarded\n%s\nwant\n%s", fw.Body, tc.want)
			}
			if fw.Path != "/v1"+strings.TrimPrefix(tc.path, "/v1") {
				t.Errorf("path %s", fw.Path)
			}
		})
	}
}

// TestForwardedStreamOptions checks the stream options a streaming request is forwarded with.
func TestForwardedStreamOptions(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	tests := []struct {
		name       string
		body       string
		continuous bool
		options    map[string]any // the client's other keys, kept
	}{
		{name: "qwen3-32b without options", body: chatBody("qwen3-32b", "O1 [[sim:tokens=1]]", `"stream":true`, `"temperature": 0.70`), continuous: true},
		{name: "qwen3-32b include_usage false, extra key", body: chatBody("qwen3-32b", "O2 [[sim:tokens=1]]", `"stream":"true"`, `"stream_options":{"include_usage":false,"x_opt":1.50}`), continuous: true, options: map[string]any{"x_opt": json.Number("1.50")}},
		{name: "gpt-oss without options", body: chatBody("gpt-oss-120b", "O3 [[sim:tokens=1]]", `"stream":1`)},
		{name: "gpt-oss include_usage true", body: chatBody("gpt-oss-120b", "O4 [[sim:tokens=1]]", `"stream":true`, `"stream_options":{"include_usage":true}`)},
		{name: "gpt-oss client asks for continuous usage", body: chatBody("gpt-oss-120b", "O5 [[sim:tokens=1]]", `"stream":true`, `"stream_options":{"continuous_usage_stats":true}`), options: map[string]any{"continuous_usage_stats": true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(req{path: "/v1/chat/completions", body: tc.body, key: h.key})
			if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %s", r.status, r.body)
			}
			marker := tc.body[strings.Index(tc.body, "[[sim:")-3 : strings.Index(tc.body, "[[sim:")]
			fw, _ := h.rec.find(t, marker)
			var got struct {
				Stream        json.RawMessage `json:"stream"`
				StreamOptions map[string]any  `json:"stream_options"`
				Temperature   json.RawMessage `json:"temperature"`
			}
			dec := json.NewDecoder(bytes.NewReader(fw.Body))
			dec.UseNumber()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("forwarded %s: %v", fw.Body, err)
			}
			if string(got.Stream) != "true" {
				t.Errorf("stream forwarded as %s", got.Stream)
			}
			want := map[string]any{"include_usage": true}
			if tc.continuous {
				want["continuous_usage_stats"] = true
			}
			for k, v := range tc.options {
				if _, set := want[k]; !set {
					want[k] = v
				}
			}
			if len(got.StreamOptions) != len(want) {
				t.Errorf("stream_options %v, want %v", got.StreamOptions, want)
			}
			for k, v := range want {
				if got.StreamOptions[k] != v {
					t.Errorf("stream_options[%s] = %v, want %v (body %s)", k, got.StreamOptions[k], v, fw.Body)
				}
			}
			if got.Temperature != nil && string(got.Temperature) != "0.70" {
				t.Errorf("temperature forwarded as %s", got.Temperature)
			}
			// Everything before stream_options is the client's text, with the model renamed.
			if i := strings.Index(tc.body, `,"stream"`); !strings.HasPrefix(string(fw.Body), renameModel(tc.body[:i])) {
				t.Errorf("forwarded %s does not start with the client's %s", fw.Body, tc.body[:i])
			}
		})
	}
}

func renameModel(s string) string {
	s = strings.Replace(s, `"model":"qwen3-32b"`, `"model":"Qwen/Qwen3-32B"`, 1)
	return strings.Replace(s, `"model":"gpt-oss-120b"`, `"model":"openai/gpt-oss-120b"`, 1)
}

// TestForwardedHeaders checks that the client's key never reaches a backend, and that a backend
// with its own key gets that one.
func TestForwardedHeaders(t *testing.T) {
	t.Parallel()
	h := newHarness(t,
		config{extraModels: extraModel("keyed-model", backendYAML("keyed-1", "SIM_URL", "openai/gpt-oss-120b")+"        api_key_env: SIM_KEY\n")},
		config{upstream: func(o *upstream.Options) {
			o.Getenv = func(k string) string {
				if k == "SIM_KEY" {
					return "backend-secret"
				}
				return ""
			}
		}},
	)
	tests := []struct {
		model, marker, auth string
	}{
		{"qwen3-32b", "H1", ""},
		{"gpt-oss-120b", "H2", ""},
		{"keyed-model", "H3", "Bearer backend-secret"},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			r := h.do(req{path: "/v1/chat/completions", body: chatBody(tc.model, tc.marker+" [[sim:tokens=1]]"), key: h.key,
				header: http.Header{"X-Custom": {"c"}, "Cookie": {"session=1"}}})
			if r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			fw, _ := h.rec.find(t, tc.marker+" ")
			if got := fw.Header.Values("Authorization"); (tc.auth == "" && len(got) != 0) || (tc.auth != "" && (len(got) != 1 || got[0] != tc.auth)) {
				t.Errorf("backend got Authorization %q, want %q", got, tc.auth)
			}
			for name, vs := range fw.Header {
				for _, v := range vs {
					if strings.Contains(v, h.key) {
						t.Errorf("header %s carries the client's key", name)
					}
				}
			}
			if fw.Header.Get("Cookie") != "" {
				t.Errorf("client cookie forwarded")
			}
			if bytes.Contains(fw.Body, []byte(h.key)) {
				t.Errorf("body carries the client's key")
			}
		})
	}
}
