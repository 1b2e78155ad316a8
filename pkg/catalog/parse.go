package catalog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/neocloud/kiln/pkg/money"
	"go.yaml.in/yaml/v3"
)

// Version is the only catalog file format version this package reads.
const Version = 1

// MaxIDLen is the longest model id (and backend name) a catalog may hold, in bytes: a longer id a
// client sends is never a model, and nothing the gateway records or quotes of it need be longer.
const MaxIDLen = 256

// Modalities are the input modalities a model may declare.
var Modalities = []string{"text", "image", "audio"}

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9._:/-]+$`)
	envVarPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// The file* types mirror the YAML file where Model does not: prices are kept as nodes so that an
// unquoted number can be told apart from a string (a YAML float would be a float somewhere before
// it is money).
type fileCatalog struct {
	Version int         `yaml:"version"`
	Models  []fileModel `yaml:"models"`
}

type fileModel struct {
	Model   `yaml:",inline"`
	Pricing *filePricing `yaml:"pricing"`
}

type filePricing struct {
	Input       yaml.Node `yaml:"input"`
	CachedInput yaml.Node `yaml:"cached_input"`
	Output      yaml.Node `yaml:"output"`
}

// Load reads and validates the catalog file at path.
func Load(path string) (*Catalog, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load catalog: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load catalog %s:\n%w", path, err)
	}
	return c, nil
}

// Parse reads and validates a catalog file. Unknown keys and values of the wrong type are errors;
// when the file's shape is right, every validation problem is reported together, each prefixed
// with its location, e.g. "models[1].pricing.output: ...".
func Parse(data []byte) (*Catalog, error) {
	var f fileCatalog
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("catalog is empty")
		}
		return nil, shapeError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("catalog holds more than one YAML document")
	}
	return f.build()
}

// typeNames turns the decoder's Go type names into words an operator knows.
var typeNames = strings.NewReplacer(
	"type catalog.fileCatalog", "the catalog",
	"type catalog.fileModel", "a model",
	"type catalog.filePricing", "pricing",
	"type catalog.Backend", "a backend",
	"catalog.fileCatalog", "the catalog",
	"[]catalog.fileModel", "a list of models",
	"catalog.fileModel", "a model",
	"catalog.filePricing", "pricing",
	"[]catalog.Backend", "a list of backends",
	"catalog.Backend", "a backend",
	"catalog.Server", "string", // as when Server was a string field of the file's own type
)

// shapeError rewrites the decoder's errors (one per line, each with its line number) so that
// they name the catalog's parts instead of this package's types.
func shapeError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("catalog is not valid YAML: %w", err)
	}
	errs := make([]error, 0, len(te.Errors))
	for _, e := range te.Errors {
		errs = append(errs, errors.New(typeNames.Replace(e)))
	}
	return errors.Join(errs...)
}

func (f *fileCatalog) build() (*Catalog, error) {
	var errs []error
	fail := func(loc, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", loc, fmt.Sprintf(format, args...)))
	}

	if f.Version != Version {
		if f.Version == 0 {
			fail("version", "missing; must be %d", Version)
		} else {
			fail("version", "must be %d, got %d", Version, f.Version)
		}
	}
	if len(f.Models) == 0 {
		fail("models", "at least one model is required")
	}

	c := &Catalog{Version: f.Version, byID: make(map[string]*Model, len(f.Models))}
	idAt := map[string]string{}      // model id → where it was first defined
	backendAt := map[string]string{} // backend name → where it was first defined
	for i := range f.Models {
		fm, at := &f.Models[i], fmt.Sprintf("models[%d]", i)
		m := &fm.Model
		if err := unique(fm.ID, at, idAt); err != nil {
			fail(at+".id", "%v", err)
		}
		if fm.Created < 0 {
			fail(at+".created", "must not be negative, got %d", fm.Created)
		}
		if fm.ContextLength <= 0 {
			fail(at+".context_length", "must be greater than 0, got %d", fm.ContextLength)
		}
		if len(fm.InputModalities) == 0 {
			fail(at+".input_modalities", "at least one of %s is required", strings.Join(Modalities, ", "))
		}
		for j, mod := range fm.InputModalities {
			switch {
			case !slices.Contains(Modalities, mod):
				fail(fmt.Sprintf("%s.input_modalities[%d]", at, j), "%q is not one of %s", mod, strings.Join(Modalities, ", "))
			case slices.Index(fm.InputModalities, mod) < j:
				fail(fmt.Sprintf("%s.input_modalities[%d]", at, j), "%q is listed twice", mod)
			}
		}

		if fm.Pricing == nil {
			fail(at+".pricing", "missing; input, cached_input and output are required")
		} else {
			read := func(key string, n *yaml.Node) money.Amount {
				a, err := price(n)
				if err != nil {
					fail(at+".pricing."+key, "%v", err)
				}
				return a
			}
			p := fm.Pricing
			m.Pricing = money.Prices{Input: read("input", &p.Input), CachedInput: read("cached_input", &p.CachedInput), Output: read("output", &p.Output)}
		}

		if len(fm.Backends) == 0 {
			fail(at+".backends", "at least one backend is required")
		}
		for j := range m.Backends {
			b, bat := &m.Backends[j], fmt.Sprintf("%s.backends[%d]", at, j)
			if b.Server == "" {
				b.Server = ServerVLLM
			} else if !slices.Contains(Servers, b.Server) {
				fail(bat+".server", "%q is not one of vllm, sglang", b.Server)
			}
			if err := unique(b.Name, bat, backendAt); err != nil {
				fail(bat+".name", "%v", err)
			}
			u, err := baseURL(b.URL)
			if err != nil {
				fail(bat+".url", "%v", err)
			}
			b.URL = u
			if strings.TrimSpace(b.Model) != b.Model {
				fail(bat+".model", "%q has leading or trailing spaces", b.Model)
			}
			if b.Model == "" {
				b.Model = fm.ID
			}
			if b.APIKeyEnv != "" && !envVarPattern.MatchString(b.APIKeyEnv) {
				fail(bat+".api_key_env", "%q is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", b.APIKeyEnv)
			}
		}

		c.Models = append(c.Models, m)
		if _, dup := c.byID[m.ID]; !dup {
			c.byID[m.ID] = m
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// unique checks a model id or backend name defined at loc and records it in seen (name → where
// it was first defined).
func unique(name, loc string, seen map[string]string) error {
	switch {
	case name == "":
		return errors.New("missing")
	case !idPattern.MatchString(name):
		return fmt.Errorf("%q may hold only letters, digits and . _ : / -", name)
	case len(name) > MaxIDLen:
		return fmt.Errorf("%d bytes long: at most %d", len(name), MaxIDLen)
	case seen[name] != "":
		return fmt.Errorf("%q is already used by %s", name, seen[name])
	}
	seen[name] = loc
	return nil
}

// price reads a price node, which must be a YAML string: an unquoted 0.035 is a float to YAML,
// and prices never pass through floats.
func price(n *yaml.Node) (money.Amount, error) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null") {
		return 0, errors.New(`missing; write the USD price per 1M tokens as a quoted decimal, e.g. "0.035"`)
	}
	if n.Kind != yaml.ScalarNode {
		return 0, errors.New(`must be a quoted decimal string, e.g. "0.035"`)
	}
	if n.ShortTag() != "!!str" {
		return 0, fmt.Errorf("must be a quoted string: write %q, not %s, so the price is never read as a float", n.Value, n.Value)
	}
	return money.ParsePrice(n.Value)
}

// baseURL checks a backend base URL and drops one trailing slash.
func baseURL(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("missing; e.g. http://10.0.0.5:8000/v1")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL", raw)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%q must be an absolute http or https URL", raw)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("%q has no host", raw)
	case u.User != nil:
		return "", fmt.Errorf("%q must not carry credentials; use api_key_env", raw)
	case u.RawQuery != "" || u.ForceQuery || strings.Contains(raw, "?"):
		return "", fmt.Errorf("%q must not have a query", raw)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return "", fmt.Errorf("%q must not have a fragment", raw)
	}
	norm := strings.TrimSuffix(raw, "/")
	if !strings.HasSuffix(norm, "/v1") || !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") {
		return "", fmt.Errorf("%q: the path must end in /v1", raw)
	}
	return norm, nil
}
