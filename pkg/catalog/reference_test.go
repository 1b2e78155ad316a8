package catalog_test

import (
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
)

func TestReferenceCatalog(t *testing.T) {
	c, err := catalog.Parse(catalog.ReferenceYAML())
	if err != nil {
		t.Fatalf("reference catalog: %v", err)
	}
	checkInvariants(t, c)

	if got := []string{c.Models[0].ID, c.Models[1].ID}; len(c.Models) != 2 || got[0] != "qwen3-32b" || got[1] != "gpt-oss-120b" {
		t.Fatalf("models = %v, want [qwen3-32b gpt-oss-120b] in file order", modelIDs(c))
	}

	type want struct {
		contextLength               int
		parallel, forced, ignoreEOS bool
		input, cachedInput, output  string
		backend, url, backendModel  string
		continuousUsage             bool
		server                      catalog.Server
		cachedTokens                bool
	}
	for _, tc := range []struct {
		id   string
		want want
	}{
		{"qwen3-32b", want{40960, false, false, true, "0.06", "0.03", "0.24",
			"qwen3-32b-sim-1", "http://127.0.0.1:8090/v1", "Qwen/Qwen3-32B", true, catalog.ServerVLLM, true}},
		{"gpt-oss-120b", want{131072, true, true, false, "0.035", "0.0175", "0.07",
			"gpt-oss-120b-sim-1", "http://127.0.0.1:8090/v1", "openai/gpt-oss-120b", false, catalog.ServerSGLang, true}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			m, ok := c.Model(tc.id)
			if !ok {
				t.Fatalf("Model(%q) not found", tc.id)
			}
			w := tc.want
			if m.ContextLength != w.contextLength {
				t.Errorf("context_length = %d, want %d", m.ContextLength, w.contextLength)
			}
			if len(m.InputModalities) != 1 || m.InputModalities[0] != "text" {
				t.Errorf("input_modalities = %v, want [text]", m.InputModalities)
			}
			if m.ParallelToolCalls != w.parallel || m.ForcedToolChoice != w.forced || m.IgnoreEOS != w.ignoreEOS {
				t.Errorf("parallel_tool_calls, forced_tool_choice, ignore_eos = %v, %v, %v; want %v, %v, %v",
					m.ParallelToolCalls, m.ForcedToolChoice, m.IgnoreEOS, w.parallel, w.forced, w.ignoreEOS)
			}
			if got := [3]string{m.Pricing.Input.String(), m.Pricing.CachedInput.String(), m.Pricing.Output.String()}; got != [3]string{w.input, w.cachedInput, w.output} {
				t.Errorf("pricing = %v, want [%s %s %s]", got, w.input, w.cachedInput, w.output)
			}
			if len(m.Backends) != 1 {
				t.Fatalf("backends = %+v, want one", m.Backends)
			}
			b := m.Backends[0]
			if b.Name != w.backend || b.URL != w.url || b.Model != w.backendModel || b.ContinuousUsage != w.continuousUsage || b.APIKeyEnv != "" || b.Server != w.server || b.CachedTokens != w.cachedTokens {
				t.Errorf("backend = %+v, want %s %s %s continuous_usage=%v server=%s cached_tokens=%v", b, w.backend, w.url, w.backendModel, w.continuousUsage, w.server, w.cachedTokens)
			}
		})
	}
}

// TestSeedCosts reproduces the costs on the public endpoint pages, measured on gpt-oss-120b.
func TestSeedCosts(t *testing.T) {
	c, err := catalog.Parse(catalog.ReferenceYAML())
	if err != nil {
		t.Fatal(err)
	}
	m, ok := c.Model("gpt-oss-120b")
	if !ok {
		t.Fatal("gpt-oss-120b missing")
	}
	for _, tc := range []struct {
		name                       string
		prompt, cached, completion int64
		want                       string
	}{
		{"chat completions page", 9, 0, 12, "0.000001155"},
		{"completions page", 5, 0, 7, "0.000000665"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.Pricing.Cost(tc.prompt, tc.cached, tc.completion)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("Cost(%d, %d, %d) = %s, want %s", tc.prompt, tc.cached, tc.completion, got, tc.want)
			}
		})
	}
}

func TestModelLookup(t *testing.T) {
	c, err := catalog.Parse(catalog.ReferenceYAML())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"qwen3-32b", true},
		{"gpt-oss-120b", true},
		{"not-a-model", false},
		{"", false},
		{"Qwen/Qwen3-32B", false}, // a backend's model name is not a public id
	} {
		t.Run(tc.id, func(t *testing.T) {
			m, ok := c.Model(tc.id)
			if ok != tc.ok {
				t.Fatalf("Model(%q) ok = %v, want %v", tc.id, ok, tc.ok)
			}
			if ok && m.ID != tc.id {
				t.Errorf("Model(%q).ID = %q", tc.id, m.ID)
			}
		})
	}
}

func modelIDs(c *catalog.Catalog) []string {
	var ids []string
	for _, m := range c.Models {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestReferenceFollowsTheSimulator: the reference catalog's backends, on the simulator's default
// address in the file, move to the address the simulator is started on, and only their host
// changes; without an address they stay where the file puts them.
func TestReferenceFollowsTheSimulator(t *testing.T) {
	file, err := catalog.Parse(catalog.ReferenceYAML())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ simulator, host string }{
		{"", catalog.ReferenceSimulator},
		{"127.0.0.1:9190", "127.0.0.1:9190"},
		{"[::1]:8090", "[::1]:8090"},
	} {
		c, err := catalog.Reference(tc.simulator)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range c.Models {
			for j, b := range m.Backends {
				want := strings.Replace(file.Models[i].Backends[j].URL, catalog.ReferenceSimulator, tc.host, 1)
				if b.URL != want {
					t.Errorf("simulator %q: backend %s at %s, want %s", tc.simulator, b.Name, b.URL, want)
				}
			}
		}
	}
}
