package catalog_test

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/money"
)

func FuzzParse(f *testing.F) {
	f.Add(catalog.ReferenceYAML())
	f.Add([]byte(valid))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := catalog.Parse(data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a catalog and an error: %v", err)
			}
			return
		}
		checkInvariants(t, c)
	})
}

var (
	idRE  = regexp.MustCompile(`^[A-Za-z0-9._:/-]+$`)
	envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// checkInvariants asserts what every parsed catalog guarantees to the gateway.
func checkInvariants(t *testing.T, c *catalog.Catalog) {
	t.Helper()
	if c.Version != catalog.Version {
		t.Errorf("version = %d", c.Version)
	}
	if len(c.Models) == 0 {
		t.Error("no models")
	}
	backends := map[string]bool{}
	for i, m := range c.Models {
		if !idRE.MatchString(m.ID) {
			t.Errorf("models[%d].id = %q", i, m.ID)
		}
		if got, ok := c.Model(m.ID); !ok || got != m {
			t.Errorf("Model(%q) does not return models[%d]", m.ID, i)
		}
		if m.ContextLength <= 0 || m.Created < 0 {
			t.Errorf("models[%d]: context_length %d, created %d", i, m.ContextLength, m.Created)
		}
		if len(m.InputModalities) == 0 {
			t.Errorf("models[%d]: no input modalities", i)
		}
		for _, mod := range m.InputModalities {
			if !slices.Contains(catalog.Modalities, mod) {
				t.Errorf("models[%d]: modality %q", i, mod)
			}
		}
		for _, p := range []money.Amount{m.Pricing.Input, m.Pricing.CachedInput, m.Pricing.Output} {
			if p < 0 {
				t.Errorf("models[%d]: negative price %s", i, p)
			}
			if _, err := money.FromTokens(1, p); err != nil {
				t.Errorf("models[%d]: price %s: %v", i, p, err)
			}
		}
		if len(m.Backends) == 0 {
			t.Errorf("models[%d]: no backends", i)
		}
		for j, b := range m.Backends {
			if b.Name == "" || backends[b.Name] {
				t.Errorf("models[%d].backends[%d]: name %q empty or repeated", i, j, b.Name)
			}
			backends[b.Name] = true
			u, err := url.Parse(b.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" ||
				u.User != nil || u.RawQuery != "" || u.Fragment != "" || !strings.HasSuffix(b.URL, "/v1") {
				t.Errorf("models[%d].backends[%d]: url %q", i, j, b.URL)
			}
			if b.Model == "" {
				t.Errorf("models[%d].backends[%d]: empty model", i, j)
			}
			if b.APIKeyEnv != "" && !envRE.MatchString(b.APIKeyEnv) {
				t.Errorf("models[%d].backends[%d]: api_key_env %q", i, j, b.APIKeyEnv)
			}
		}
	}
}
