package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/catalog"
)

// TestModelsPagesMatchReferenceCatalog fails when a committed docs/customer/*/models.md and the
// reference catalog disagree; `make customer-docs` regenerates them.
func TestModelsPagesMatchReferenceCatalog(t *testing.T) {
	cat, err := catalog.Parse(catalog.ReferenceYAML())
	if err != nil {
		t.Fatal(err)
	}
	for _, lang := range []string{"en", "ja", "ko"} {
		t.Run(lang, func(t *testing.T) {
			want, err := modelsPage(cat, modelsPageWords[lang])
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("..", "..", "docs", "customer", lang, "models.md")
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run make customer-docs)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the page the reference catalog gives; run make customer-docs\n--- committed\n%s\n--- from the catalog\n%s", path, got, want)
			}
		})
	}
}

// TestModelsPageShowsCatalogFacts checks the rendered page against the catalog's own values, so
// a renderer that dropped or mixed up a column fails even when the committed page was
// regenerated with it.
func TestModelsPageShowsCatalogFacts(t *testing.T) {
	const file = `version: 1
models:
  - id: vision-7b
    owned_by: neocloud
    created: 1
    context_length: 32768
    input_modalities: [text, image]
    parallel_tool_calls: true
    forced_tool_choice: false
    ignore_eos: true
    pricing: {input: "0.000001", cached_input: "0", output: "12.5"}
    backends:
      - {name: v1, url: "http://127.0.0.1:1/v1"}
`
	path := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"catalog", "docs", "--lang", "en", "--catalog", path}, func(string) string { return "" }, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	row := "| `vision-7b` | 32,768 | text, image | yes | no | yes | 0.000001 | 0.00 | 12.50 |"
	if !strings.Contains(stdout.String(), row+"\n") {
		t.Errorf("page lacks the row\n%s\n--- page\n%s", row, stdout.String())
	}
	// 1000 prompt (200 cached) and 500 completion tokens: 800 × 0.000001/1M + 200 × 0 + 500 × 12.5/1M.
	if want := "costs 0.0062500008 USD."; !strings.Contains(stdout.String(), want) {
		t.Errorf("page lacks the example cost %q\n%s", want, stdout.String())
	}
}

// TestCatalogDocsJSON checks that --json carries the same page as the Markdown output.
func TestCatalogDocsJSON(t *testing.T) {
	var md, js, stderr bytes.Buffer
	getenv := func(string) string { return "" }
	if code := run(context.Background(), []string{"catalog", "docs", "--lang", "ko"}, getenv, &md, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if code := run(context.Background(), []string{"catalog", "docs", "--lang", "ko", "--json"}, getenv, &js, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got struct{ Lang, Page string }
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if got.Lang != "ko" || got.Page != md.String() || md.Len() == 0 {
		t.Errorf("--json gave lang %q and a page of %d bytes; want ko and the %d bytes of the Markdown output", got.Lang, len(got.Page), md.Len())
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 40960: "40,960", 131072: "131,072", 1048576: "1,048,576", -1500: "-1,500"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestCatalogDocsRefusesBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "models.md")
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"no language", []string{"catalog", "docs"}, 2},
		{"unknown language", []string{"catalog", "docs", "--lang", "fr"}, 2},
		{"unexpected argument", []string{"catalog", "docs", "--lang", "en", "models.md"}, 2},
		{"invalid catalog", []string{"catalog", "docs", "--lang", "en", "--catalog", bad, "--out", out}, 1},
		{"missing catalog", []string{"catalog", "docs", "--lang", "en", "--catalog", bad + ".missing", "--out", out}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, func(string) string { return "" }, &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.code, stderr.String())
			}
			if stdout.Len() != 0 || stderr.Len() == 0 {
				t.Errorf("stdout %q, stderr %q: want only an error", stdout.String(), stderr.String())
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a failed command left %s behind", out)
			}
		})
	}
}
