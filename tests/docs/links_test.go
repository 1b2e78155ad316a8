package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pages are the customer pages every language has.
var pages = []string{"api-reference.md", "errors.md", "models.md", "rate-limits.md", "streaming.md"}

// mdLink matches an inline Markdown link's target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestCustomerPagesExistAndLinksResolve fails when a language lacks one of the pages, has one the
// others do not, or a relative link in a page (or in the README's list of them) names a file that
// does not exist.
func TestCustomerPagesExistAndLinksResolve(t *testing.T) {
	for _, lang := range langs {
		dir := filepath.Join(root, "docs", "customer", lang)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var have []string
		for _, e := range entries {
			have = append(have, e.Name())
		}
		if !slices.Equal(have, pages) {
			t.Errorf("%s holds %v, want %v", dir, have, pages)
		}
		for _, name := range have {
			checkLinks(t, filepath.Join(dir, name))
		}
	}
	checkLinks(t, filepath.Join(root, "README.md"))
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, lang := range langs {
		for _, p := range pages {
			if link := "(docs/customer/" + lang + "/" + p + ")"; !strings.Contains(string(readme), link) {
				t.Errorf("README.md does not link %s", link)
			}
		}
	}
}

// checkLinks fails for each relative link of the Markdown file at path whose file is missing.
// Links to the web and anchors within the page are left alone.
func checkLinks(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		target, _, _ = strings.Cut(target, "#")
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
			t.Errorf("%s: link %q does not resolve: %v", path, m[1], err)
		}
	}
}
