package catalog_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
)

// valid is a small valid catalog; the cases below each break one line of it.
const valid = `version: 1
models:
  - id: m1
    owned_by: acme
    created: 1
    context_length: 4096
    input_modalities: [text, image]
    parallel_tool_calls: true
    forced_tool_choice: true
    ignore_eos: true
    pricing:
      input: "0.035"
      cached_input: "0.0175"
      output: "0.07"
    backends:
      - name: b1
        url: http://127.0.0.1:8090/v1
        model: org/m1
        continuous_usage: true
        api_key_env: M1_KEY
`

// second is a second valid model, appended to valid where a rule spans models.
const second = `  - id: m2
    context_length: 1
    input_modalities: [audio]
    pricing: {input: "0", cached_input: "0", output: "1"}
    backends:
      - name: b2
        url: https://m2.example/v1
`

// edit returns valid with old replaced by new, failing if old is not there.
func edit(t *testing.T, doc, old, new string) string {
	t.Helper()
	if !strings.Contains(doc, old) {
		t.Fatalf("test bug: %q not in the catalog", old)
	}
	return strings.Replace(doc, old, new, 1)
}

func TestParseValid(t *testing.T) {
	c, err := catalog.Parse([]byte(valid + second))
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, c)
	m, _ := c.Model("m1")
	if m.OwnedBy != "acme" || m.Created != 1 || m.ContextLength != 4096 || !m.ParallelToolCalls || !m.ForcedToolChoice || !m.IgnoreEOS {
		t.Errorf("m1 = %+v", m)
	}
	if b := m.Backends[0]; b.Name != "b1" || b.Model != "org/m1" || !b.ContinuousUsage || b.APIKeyEnv != "M1_KEY" || b.Server != catalog.ServerVLLM || b.CachedTokens {
		t.Errorf("m1 backend = %+v", b)
	}
	m2, _ := c.Model("m2")
	if m2.ParallelToolCalls || m2.ForcedToolChoice || m2.IgnoreEOS || m2.OwnedBy != "" || m2.Created != 0 {
		t.Errorf("m2 defaults = %+v", m2)
	}
	if m2.Pricing.Input != 0 || m2.Pricing.Output.String() != "1" {
		t.Errorf("m2 pricing = %+v", m2.Pricing)
	}
}

func TestParseNormalises(t *testing.T) {
	for _, tc := range []struct {
		name, old, new string
		check          func(*catalog.Backend) bool
	}{
		{"trailing slash dropped", "url: http://127.0.0.1:8090/v1", "url: http://127.0.0.1:8090/v1/",
			func(b *catalog.Backend) bool { return b.URL == "http://127.0.0.1:8090/v1" }},
		{"longer path", "url: http://127.0.0.1:8090/v1", "url: https://gw.example:8443/openai/v1",
			func(b *catalog.Backend) bool { return b.URL == "https://gw.example:8443/openai/v1" }},
		{"model defaults to the public id", "        model: org/m1\n", "",
			func(b *catalog.Backend) bool { return b.Model == "m1" }},
		{"empty model defaults to the public id", "model: org/m1", `model: ""`,
			func(b *catalog.Backend) bool { return b.Model == "m1" }},
		{"api_key_env optional", "        api_key_env: M1_KEY\n", "",
			func(b *catalog.Backend) bool { return b.APIKeyEnv == "" }},
		{"server sglang", "        continuous_usage: true\n", "        continuous_usage: true\n        server: sglang\n",
			func(b *catalog.Backend) bool { return b.Server == catalog.ServerSGLang }},
		{"server vllm spelt out", "        continuous_usage: true\n", "        continuous_usage: true\n        server: vllm\n",
			func(b *catalog.Backend) bool { return b.Server == catalog.ServerVLLM }},
		{"cached tokens reported", "        continuous_usage: true\n", "        continuous_usage: true\n        cached_tokens: true\n",
			func(b *catalog.Backend) bool { return b.CachedTokens }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := catalog.Parse([]byte(edit(t, valid, tc.old, tc.new)))
			if err != nil {
				t.Fatal(err)
			}
			if b := &c.Models[0].Backends[0]; !tc.check(b) {
				t.Errorf("backend = %+v", *b)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	two := valid + second
	for _, tc := range []struct {
		name string
		doc  string
		want string // the error names this location and reason
	}{
		{"empty file", "", "empty"},
		{"not YAML", "version: [1", "not valid YAML"},
		{"two documents", valid + "---\n" + valid, "more than one YAML document"},
		{"version missing", edit(t, valid, "version: 1\n", ""), "version: missing"},
		{"version 2", edit(t, valid, "version: 1", "version: 2"), "version: must be 1, got 2"},
		{"no models", "version: 1\nmodels: []\n", "models: at least one model"},
		{"models missing", "version: 1\n", "models: at least one model"},
		{"id missing", edit(t, valid, "  - id: m1\n    owned_by", "  - owned_by"), "models[0].id: missing"},
		{"id empty", edit(t, valid, "id: m1", `id: ""`), "models[0].id: missing"},
		{"id with a space", edit(t, valid, "id: m1", `id: "m 1"`), `models[0].id: "m 1" may hold only`},
		{"id with a non-ASCII letter", edit(t, valid, "id: m1", `id: "mé"`), `models[0].id: "mé" may hold only`},
		{"id of 257 bytes", edit(t, valid, "id: m1", "id: m"+strings.Repeat("1", 256)), "models[0].id: 257 bytes long: at most 256"},
		{"id repeated", edit(t, two, "id: m2", "id: m1"), `models[1].id: "m1" is already used by models[0]`},
		{"created negative", edit(t, valid, "created: 1", "created: -1"), "models[0].created: must not be negative"},
		{"context_length zero", edit(t, valid, "context_length: 4096", "context_length: 0"), "models[0].context_length: must be greater than 0"},
		{"context_length missing", edit(t, valid, "    context_length: 4096\n", ""), "models[0].context_length: must be greater than 0"},
		{"context_length negative", edit(t, valid, "context_length: 4096", "context_length: -5"), "models[0].context_length: must be greater than 0, got -5"},
		{"modalities empty", edit(t, valid, "[text, image]", "[]"), "models[0].input_modalities: at least one"},
		{"modalities missing", edit(t, valid, "    input_modalities: [text, image]\n", ""), "models[0].input_modalities: at least one"},
		{"modality unknown", edit(t, valid, "[text, image]", "[text, video]"), `models[0].input_modalities[1]: "video" is not one of text, image, audio`},
		{"modality repeated", edit(t, valid, "[text, image]", "[text, text]"), `models[0].input_modalities[1]: "text" is listed twice`},
		{"pricing missing", edit(t, valid, "    pricing:\n      input: \"0.035\"\n      cached_input: \"0.0175\"\n      output: \"0.07\"\n", ""), "models[0].pricing: missing"},
		{"price missing", edit(t, valid, "      output: \"0.07\"\n", ""), "models[0].pricing.output: missing"},
		{"price null", edit(t, valid, `cached_input: "0.0175"`, "cached_input: null"), "models[0].pricing.cached_input: missing"},
		{"price unquoted float", edit(t, valid, `output: "0.07"`, "output: 0.07"), `models[0].pricing.output: must be a quoted string: write "0.07"`},
		{"price unquoted int", edit(t, valid, `input: "0.035"`, "input: 1"), `models[0].pricing.input: must be a quoted string: write "1"`},
		{"price a list", edit(t, valid, `input: "0.035"`, "input: [1]"), "models[0].pricing.input: must be a quoted decimal string"},
		{"price negative", edit(t, valid, `output: "0.07"`, `output: "-0.07"`), "models[0].pricing.output: " + `price "-0.07": must not be negative`},
		{"price seven decimals", edit(t, valid, `input: "0.035"`, `input: "0.0000001"`), "models[0].pricing.input: " + `amount "0.0000001": more than 6 decimal places`},
		{"price exponent", edit(t, valid, `input: "0.035"`, `input: "3.5e-2"`), "models[0].pricing.input: " + `amount "3.5e-2": not a plain decimal number`},
		{"price empty", edit(t, valid, `input: "0.035"`, `input: ""`), "models[0].pricing.input: " + `amount "": empty`},
		{"backends empty", edit(t, valid, "    backends:\n      - name: b1\n        url: http://127.0.0.1:8090/v1\n        model: org/m1\n        continuous_usage: true\n        api_key_env: M1_KEY\n", "    backends: []\n"), "models[0].backends: at least one backend"},
		{"backends missing", edit(t, two, "    backends:\n      - name: b2\n        url: https://m2.example/v1\n", ""), "models[1].backends: at least one backend"},
		{"backend name missing", edit(t, valid, "name: b1", `name: ""`), "models[0].backends[0].name: missing"},
		{"backend name with a space", edit(t, valid, "name: b1", `name: "b 1"`), `models[0].backends[0].name: "b 1" may hold only`},
		{"backend name repeated across models", edit(t, two, "name: b2", "name: b1"), `models[1].backends[0].name: "b1" is already used by models[0].backends[0]`},
		{"backend name repeated in a model", edit(t, valid, "        api_key_env: M1_KEY\n", "      - name: b1\n        url: http://127.0.0.1:8091/v1\n"), `models[0].backends[1].name: "b1" is already used by models[0].backends[0]`},
		{"url missing", edit(t, valid, "        url: http://127.0.0.1:8090/v1\n", ""), "models[0].backends[0].url: missing"},
		{"url relative", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: /v1"), "models[0].backends[0].url: \"/v1\" must be an absolute http or https URL"},
		{"url scheme ftp", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: ftp://host/v1"), "models[0].backends[0].url: \"ftp://host/v1\" must be an absolute http or https URL"},
		{"url without host", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http:///v1"), "models[0].backends[0].url: \"http:///v1\" has no host"},
		{"url with port only", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://:8090/v1"), "models[0].backends[0].url: \"http://:8090/v1\" has no host"},
		{"url with a query", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h/v1?x=1"), "models[0].backends[0].url: \"http://h/v1?x=1\" must not have a query"},
		{"url with an empty query", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h/v1?"), "models[0].backends[0].url: \"http://h/v1?\" must not have a query"},
		{"url with a fragment", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h/v1#x"), "models[0].backends[0].url: \"http://h/v1#x\" must not have a fragment"},
		{"url with user info", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://u:p@h/v1"), "models[0].backends[0].url: \"http://u:p@h/v1\" must not carry credentials"},
		{"url path not /v1", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h/v2"), "models[0].backends[0].url: \"http://h/v2\": the path must end in /v1"},
		{"url without path", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h"), "models[0].backends[0].url: \"http://h\": the path must end in /v1"},
		{"url path two slashes", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h/v1//"), "models[0].backends[0].url: \"http://h/v1//\": the path must end in /v1"},
		{"url path escaped", edit(t, valid, "url: http://127.0.0.1:8090/v1", "url: http://h/%76%31"), "models[0].backends[0].url: \"http://h/%76%31\": the path must end in /v1"},
		{"url not a URL", edit(t, valid, "url: http://127.0.0.1:8090/v1", `url: "http://h:port/v1"`), "models[0].backends[0].url: \"http://h:port/v1\" is not a URL"},
		{"backend model padded", edit(t, valid, "model: org/m1", `model: " org/m1"`), `models[0].backends[0].model: " org/m1" has leading or trailing spaces`},
		{"server unknown", edit(t, valid, "        continuous_usage: true\n", "        continuous_usage: true\n        server: tgi\n"), `models[0].backends[0].server: "tgi" is not one of vllm, sglang`},
		{"server capitalised", edit(t, valid, "        continuous_usage: true\n", "        continuous_usage: true\n        server: vLLM\n"), `models[0].backends[0].server: "vLLM" is not one of vllm, sglang`},
		{"api_key_env with a dash", edit(t, valid, "api_key_env: M1_KEY", "api_key_env: M1-KEY"), `models[0].backends[0].api_key_env: "M1-KEY" is not an environment variable name`},
		{"api_key_env starting with a digit", edit(t, valid, "api_key_env: M1_KEY", "api_key_env: 1KEY"), `models[0].backends[0].api_key_env: "1KEY" is not an environment variable name`},
		{"api_key_env a token", edit(t, valid, "api_key_env: M1_KEY", "api_key_env: sk-abc"), `models[0].backends[0].api_key_env: "sk-abc" is not an environment variable name`},
		{"unknown top-level key", edit(t, valid, "version: 1\n", "version: 1\nkind: catalog\n"), "line 2: field kind not found in the catalog"},
		{"unknown model key", edit(t, valid, "    owned_by: acme\n", "    owned_by: acme\n    max_tokens: 5\n"), "line 5: field max_tokens not found in a model"},
		{"unknown pricing key", edit(t, valid, "      output: \"0.07\"\n", "      output: \"0.07\"\n      reasoning: \"1\"\n"), "line 15: field reasoning not found in pricing"},
		{"unknown backend key", edit(t, valid, "        model: org/m1\n", "        model: org/m1\n        api_key: sk-secret\n"), "line 19: field api_key not found in a backend"},
		{"misspelt key", edit(t, valid, "context_length:", "context_lenght:"), "field context_lenght not found in a model"},
		{"repeated key", edit(t, valid, "    created: 1\n", "    created: 1\n    created: 2\n"), `mapping key "created" already defined`},
		{"wrong type", edit(t, valid, "context_length: 4096", "context_length: lots"), "line 6: cannot unmarshal !!str `lots` into int"},
		{"bool as string", edit(t, valid, "ignore_eos: true", "ignore_eos: sometimes"), "line 10: cannot unmarshal !!str `sometimes` into bool"},
		{"models a map", "version: 1\nmodels: {a: 1}\n", "cannot unmarshal !!map into a list of models"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := catalog.Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse succeeded, want an error containing %q", tc.want)
			}
			if c != nil {
				t.Errorf("Parse returned a catalog with error %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestParseReportsEveryProblem checks that one run names every problem, so an operator fixes
// the file in one pass.
func TestParseReportsEveryProblem(t *testing.T) {
	doc := valid + second
	doc = edit(t, doc, "version: 1", "version: 3")
	doc = edit(t, doc, "context_length: 4096", "context_length: 0")
	doc = edit(t, doc, `output: "0.07"`, "output: 0.07")
	doc = edit(t, doc, "url: http://127.0.0.1:8090/v1", "url: http://127.0.0.1:8090/api")
	doc = edit(t, doc, "id: m2", "id: m1")
	doc = edit(t, doc, "name: b2", "name: b1")
	doc = edit(t, doc, "[audio]", "[smell]")
	_, err := catalog.Parse([]byte(doc))
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	want := []string{
		"version: must be 1, got 3",
		"models[0].context_length: must be greater than 0",
		"models[0].pricing.output: must be a quoted string",
		"models[0].backends[0].url: ",
		`models[1].id: "m1" is already used by models[0]`,
		`models[1].backends[0].name: "b1" is already used by models[0].backends[0]`,
		`models[1].input_modalities[0]: "smell" is not one of`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not report %q:\n%v", w, err)
		}
	}
}

func TestParseUnknownKeysAllReported(t *testing.T) {
	doc := edit(t, valid, "version: 1\n", "version: 1\nkind: catalog\n")
	doc = edit(t, doc, "        model: org/m1\n", "        model: org/m1\n        weight: 3\n")
	_, err := catalog.Parse([]byte(doc))
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	for _, w := range []string{"field kind not found", "field weight not found"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not report %q:\n%v", w, err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(valid), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(edit(t, valid, "version: 1", "version: 2")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"valid", good, ""},
		{"invalid names the file and the problem", bad, "version: must be 1"},
		{"missing file", filepath.Join(dir, "none.yaml"), "none.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := catalog.Load(tc.path)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				checkInvariants(t, c)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Base(tc.path)) {
				t.Errorf("Load(%s) error = %v, want it to name the file and contain %q", tc.path, err, tc.want)
			}
		})
	}
}
