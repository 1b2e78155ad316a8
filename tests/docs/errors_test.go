// Package docs checks the customer pages in docs/customer against the code they describe.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository root, seen from this package's directory.
const root = "../.."

var langs = []string{"en", "ja", "ko"}

// TestErrorsPagesListEveryCode fails when a status or error code the gateway can answer with is
// missing from a language's errors.md, or when a page lists a code the gateway never produces.
func TestErrorsPagesListEveryCode(t *testing.T) {
	codes, statuses := gatewayErrors(t)
	t.Logf("codes %v, statuses %v", keys(codes), keys(statuses))
	// The collector reads the sources; if it stopped finding what it should, it would pass every
	// page. These are codes and statuses the contract names.
	for _, c := range []string{"invalid_api_key", "insufficient_credits", "organization_suspended", "rate_limit_exceeded",
		"model_not_found", "request_too_large", "request_timeout", "maintenance", "backend_unavailable", "store_unavailable",
		"slot_lost", "deadline_exceeded", "upstream_stream_error", "unknown_url", "generation_not_found", "method_not_allowed",
		"empty_array", "unsupported_parameter", "malformed_request", "request_header_fields_too_large"} {
		if !codes[c] {
			t.Errorf("the collector did not find code %q in the gateway's sources", c)
		}
	}
	for _, s := range []int{400, 401, 402, 403, 404, 405, 408, 413, 429, 431, 502, 503} {
		if !statuses[s] {
			t.Errorf("the collector did not find status %d in the gateway's sources", s)
		}
	}
	for _, lang := range langs {
		t.Run(lang, func(t *testing.T) {
			path := filepath.Join(root, "docs", "customer", lang, "errors.md")
			page, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			listed, listedStatus := pageErrors(string(page))
			for c := range codes {
				if !listed[c] {
					t.Errorf("%s: code %q is missing from the table", path, c)
				}
			}
			for c := range listed {
				if !codes[c] {
					t.Errorf("%s: lists code %q, which the gateway never produces", path, c)
				}
			}
			for s := range statuses {
				if !listedStatus[s] {
					t.Errorf("%s: status %d is missing from the table", path, s)
				}
			}
		})
	}
}

// pageErrors reads the rows of a page's tables: the first cell a status or an event, the second
// the code in backquotes.
func pageErrors(page string) (codes map[string]bool, statuses map[int]bool) {
	codes, statuses = map[string]bool{}, map[int]bool{}
	code := regexp.MustCompile("^`([a-z_]+)`$")
	for _, line := range strings.Split(page, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.TrimSpace(cells[0]) != "" {
			continue
		}
		if m := code.FindStringSubmatch(strings.TrimSpace(cells[2])); m != nil {
			codes[m[1]] = true
		}
		if s, err := strconv.Atoi(strings.TrimSpace(cells[1])); err == nil {
			statuses[s] = true
		}
	}
	return codes, statuses
}

// gatewayErrors collects from the sources of pkg/gateway and functions/gateway (whose conn.go
// answers what net/http refuses) every error code a client can receive and every status an error
// answer can have:
//   - the Code of an openai.Error literal, and the status of the apiError around it;
//   - the status and code arguments of newError(status, type, code, message);
//   - the code argument of invalid(param, code, …) (400) and errNotFound(msg, code) (404);
//   - a literal assigned to a variable named code, or returned for a result named code;
//   - the status and code literals passed to answer(status, code, msg), and the statuses under
//     500 that describeNetHTTPError names (the ones from 500 up are answered as 400);
//   - the status of a WriteHeader call (the plain-text 502).
func gatewayErrors(t *testing.T) (codes map[string]bool, statuses map[int]bool) {
	t.Helper()
	codes, statuses = map[string]bool{}, map[int]bool{}
	addCode := func(e ast.Expr) {
		if s, ok := stringLit(e); ok && s != "" {
			codes[s] = true
		}
	}
	addStatus := func(e ast.Expr) {
		if n, ok := httpStatus(e); ok {
			statuses[n] = true
		}
	}
	for _, dir := range []string{"pkg/gateway", "functions/gateway"} {
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CompositeLit:
					switch typeName(n.Type) {
					case "openai.Error":
						if v := field(n, "Code"); v != nil {
							addCode(v)
						}
					case "apiError":
						if v := field(n, "status"); v != nil {
							addStatus(v)
						}
					}
				case *ast.CallExpr:
					switch callee(n) {
					case "invalid":
						if len(n.Args) >= 2 {
							addCode(n.Args[1])
							statuses[http.StatusBadRequest] = true
						}
					case "newError":
						if len(n.Args) == 4 {
							addStatus(n.Args[0])
							addCode(n.Args[2])
						}
					case "errNotFound":
						if len(n.Args) == 2 {
							addCode(n.Args[1])
							statuses[http.StatusNotFound] = true
						}
					case "answer":
						if len(n.Args) == 3 {
							addStatus(n.Args[0])
							addCode(n.Args[1])
						}
					case "WriteHeader":
						// Only error answers: the 200 of a stream is written this way too.
						if s, ok := httpStatus(n.Args[0]); ok && len(n.Args) == 1 && s >= 400 {
							statuses[s] = true
						}
					}
				case *ast.AssignStmt:
					for i, lhs := range n.Lhs {
						if id, ok := lhs.(*ast.Ident); ok && id.Name == "code" && i < len(n.Rhs) && len(n.Lhs) == len(n.Rhs) {
							addCode(n.Rhs[i])
						}
					}
				case *ast.FuncDecl:
					collectNamedCodeResults(n, addCode)
					if n.Name.Name == "describeNetHTTPError" {
						ast.Inspect(n.Body, func(m ast.Node) bool {
							if cc, ok := m.(*ast.CaseClause); ok {
								for _, e := range cc.List {
									if s, ok := httpStatus(e); ok && s < 500 {
										statuses[s] = true
									}
								}
							}
							return true
						})
					}
				}
				return true
			})
		}
	}
	return codes, statuses
}

// collectNamedCodeResults adds the literals a function returns for its result named code.
func collectNamedCodeResults(fn *ast.FuncDecl, add func(ast.Expr)) {
	if fn.Type.Results == nil || fn.Body == nil {
		return
	}
	pos, i := -1, 0
	for _, r := range fn.Type.Results.List {
		for _, name := range r.Names {
			if name.Name == "code" {
				pos = i
			}
			i++
		}
		if len(r.Names) == 0 {
			i++
		}
	}
	if pos < 0 {
		return
	}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if _, ok := n.(*ast.FuncLit); ok {
			return false
		}
		if ret, ok := n.(*ast.ReturnStmt); ok && len(ret.Results) == i {
			add(ret.Results[pos])
		}
		return true
	})
}

func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			return x.Name + "." + e.Sel.Name
		}
	}
	return ""
}

func callee(c *ast.CallExpr) string {
	switch f := c.Fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

func field(lit *ast.CompositeLit, key string) ast.Expr {
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == key {
				return kv.Value
			}
		}
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// httpStatus reads http.StatusXxx as its number.
func httpStatus(e ast.Expr) (int, bool) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return 0, false
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "http" {
		return 0, false
	}
	n, ok := statusByName[sel.Sel.Name]
	return n, ok
}

// statusByName maps net/http's status constant names to their values.
var statusByName = func() map[string]int {
	m := map[string]int{}
	for code := 100; code < 600; code++ {
		text := http.StatusText(code)
		if text == "" {
			continue
		}
		name := "Status" + strings.Map(func(r rune) rune {
			if r == ' ' || r == '-' || r == '\'' {
				return -1
			}
			return r
		}, text)
		m[name] = code
	}
	// Names that do not follow from the status text.
	m["StatusRequestEntityTooLarge"] = http.StatusRequestEntityTooLarge
	m["StatusRequestURITooLong"] = http.StatusRequestURITooLong
	m["StatusHTTPVersionNotSupported"] = http.StatusHTTPVersionNotSupported
	m["StatusNetworkAuthenticationRequired"] = http.StatusNetworkAuthenticationRequired
	m["StatusRequestedRangeNotSatisfiable"] = http.StatusRequestedRangeNotSatisfiable
	m["StatusUnsupportedMediaType"] = http.StatusUnsupportedMediaType
	m["StatusTeapot"] = http.StatusTeapot
	return m
}()

func keys[K string | int](m map[K]bool) []K {
	var ks []K
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
