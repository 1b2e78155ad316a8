package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/openai"
)

// FuzzCheck runs the endpoint checks and the forward rewrite on arbitrary bodies. They must never
// panic, and whenever a body is accepted, the body forwarded to each backend of its model is one
// valid JSON object whose members other than model, stream and stream_options are the client's,
// byte for byte and in order, with model, stream and stream_options as section 4 of the contract
// says. The seed corpus is in testdata/fuzz/FuzzCheck.
func FuzzCheck(f *testing.F) {
	// Two backends per model, one renaming and one not, with and without continuous usage, so
	// that every branch of the rewrite runs for each accepted body.
	cat, err := catalog.Parse(fmt.Appendf(nil, catalogYAML, "http://127.0.0.1:9/v1",
		extraModel("plain-model",
			backendYAML("plain-1", "http://127.0.0.1:9/v1", "plain-model"),
			backendYAML("plain-2", "http://127.0.0.2:9/v1", "renamed/plain")), catalog.ServerVLLM))
	if err != nil {
		f.Fatal(err)
	}
	g := &Gateway{opt: Options{Catalog: cat}}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		ep := completionsEndpoint
		if chat {
			ep = chatEndpoint
		}
		req, _, e := g.check(ep, body)
		if e != nil {
			if e.status < 400 || e.status > 499 {
				t.Fatalf("refused with status %d: %s", e.status, e.body.Message)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("invalid JSON accepted: %q", body)
		}
		in, err := openai.ParseRequest(nil, body)
		if err != nil {
			t.Fatalf("accepted body does not parse: %v", err)
		}
		for _, b := range req.model.Backends {
			checkForwarded(t, &req, b, body, in)
		}
	})
}

// owned names the members the gateway may change; every other member is the client's.
var owned = map[string]bool{"model": true, "stream": true, "stream_options": true}

func checkForwarded(t *testing.T, req *request, b catalog.Backend, body []byte, in []openai.Field) {
	t.Helper()
	out := req.forward(b)
	if !json.Valid(out) {
		t.Fatalf("backend %s: forwarded body is not valid JSON:\n%q\nfrom\n%q", b.Name, out, body)
	}
	fields, err := openai.ParseRequest(nil, out)
	if err != nil {
		t.Fatalf("backend %s: forwarded body: %v\n%q", b.Name, err, out)
	}
	// The client's members, in order, byte for byte (key and value as written).
	var want, got [][]byte
	for _, f := range in {
		if !owned[f.Key(body)] {
			want = append(want, body[f.KeyStart:f.ValueEnd])
		}
	}
	for _, f := range fields {
		if !owned[f.Key(out)] {
			got = append(got, out[f.KeyStart:f.ValueEnd])
		}
	}
	if len(want) != len(got) {
		t.Fatalf("backend %s: %d client members forwarded, want %d\n%q\nfrom\n%q", b.Name, len(got), len(want), out, body)
	}
	for i := range want {
		if !bytes.Equal(want[i], got[i]) {
			t.Fatalf("backend %s: member %d forwarded as %q, the client wrote %q", b.Name, i, got[i], want[i])
		}
	}

	// model: the backend's name.
	mf, ok := openai.Lookup(out, fields, "model")
	if name, isStr := openai.String(mf.Value(out)); !ok || !isStr || name != b.Model {
		t.Fatalf("backend %s: model forwarded as %q, want %q", b.Name, mf.Value(out), b.Model)
	}
	// stream: a JSON boolean when the client sent it, absent otherwise.
	sf, hasStream := openai.Lookup(out, fields, "stream")
	if hasStream != req.hasStream {
		t.Fatalf("backend %s: stream forwarded %v, client sent it %v", b.Name, hasStream, req.hasStream)
	}
	if hasStream {
		if v := string(sf.Value(out)); v != map[bool]string{true: "true", false: "false"}[req.stream] {
			t.Fatalf("backend %s: stream forwarded as %q, want %v", b.Name, sf.Value(out), req.stream)
		}
	}
	// stream_options: forced include_usage (and continuous usage where the backend has it) when
	// streaming, the client's other options kept; as the client wrote it otherwise.
	of, hasOptions := openai.Lookup(out, fields, "stream_options")
	cf, clientOptions := openai.Lookup(body, in, "stream_options")
	if !req.stream {
		if hasOptions != clientOptions || (hasOptions && !bytes.Equal(of.Value(out), cf.Value(body))) {
			t.Fatalf("backend %s: stream_options changed on a request that does not stream: %q", b.Name, out)
		}
		return
	}
	if !hasOptions {
		t.Fatalf("backend %s: streaming request forwarded without stream_options: %q", b.Name, out)
	}
	ov := of.Value(out)
	ofs, err := openai.ParseRequest(nil, ov)
	if err != nil {
		t.Fatalf("backend %s: forwarded stream_options %q: %v", b.Name, ov, err)
	}
	if f, ok := openai.Lookup(ov, ofs, "include_usage"); !ok || string(f.Value(ov)) != "true" {
		t.Fatalf("backend %s: include_usage not forced on: %q", b.Name, ov)
	}
	f, ok := openai.Lookup(ov, ofs, "continuous_usage_stats")
	if b.ContinuousUsage && (!ok || string(f.Value(ov)) != "true") {
		t.Fatalf("backend %s: continuous_usage_stats not forced on: %q", b.Name, ov)
	}
	if req.options != nil {
		cofs, _ := openai.ParseRequest(nil, req.options)
		for _, cof := range cofs {
			k := cof.Key(req.options)
			if k == "include_usage" || (k == "continuous_usage_stats" && b.ContinuousUsage) {
				continue
			}
			if f, ok := openai.Lookup(ov, ofs, k); !ok || !bytes.Equal(f.Value(ov), cof.Value(req.options)) {
				t.Fatalf("backend %s: stream option %q lost or changed: %q from %q", b.Name, k, ov, req.options)
			}
		}
	}
}
