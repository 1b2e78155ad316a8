package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/tests/internal/build"
)

var gatewayBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "kiln-docs-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bins, err := build.Commands(dir, "./functions/gateway")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		gatewayBin = bins[0]
		return m.Run()
	}())
}

// publicBase is the base URL the pages show; the test points it at the local gateway.
const publicBase = "https://api.bricksum.com/v1"

// example is one curl command on a page, with the answer the page shows after it.
type example struct {
	where   string // page:line
	command string
	status  int    // the status the page shows; 200 when it shows none
	kind    string // "json", "http" (a raw HTTP answer, a stream) or "" (no answer shown)
	want    string
}

// TestCurlExamplesRun runs every curl example of every page against the built gateway, started
// as `make run` starts it, and checks that the answer has the status and shape the page shows.
func TestCurlExamplesRun(t *testing.T) {
	var examples []example
	for _, lang := range langs {
		for _, p := range pages {
			examples = append(examples, pageExamples(t, filepath.Join(root, "docs", "customer", lang, p))...)
		}
	}
	if len(examples) < 3*4 {
		t.Fatalf("found only %d curl examples in the pages", len(examples))
	}
	base, key := startGateway(t)
	genID := firstGeneration(t, base, key)
	placeholder := regexp.MustCompile(`gen-[0-9A-Z]{26}`)
	for _, ex := range examples {
		t.Run(ex.where, func(t *testing.T) {
			cmd := strings.ReplaceAll(ex.command, publicBase, base)
			// The page's generation id is one of the page author's; ask for one of this gateway's.
			cmd = placeholder.ReplaceAllString(cmd, genID)
			status, header, body := runCurl(t, cmd, key)
			if status != ex.status {
				t.Fatalf("status %d, the page shows %d\n%s", status, ex.status, body)
			}
			switch ex.kind {
			case "json":
				if err := sameJSONShape(ex.want, string(body)); err != nil {
					t.Errorf("answer differs in shape from the page: %v\npage:\n%s\ngot:\n%s", err, ex.want, body)
				}
			case "http":
				checkHTTPAnswer(t, ex.want, header, body)
			}
		})
	}
}

// pageExamples reads the curl examples of one page: a ```bash block that starts with curl, and
// the first fenced block after it when that is an answer (json, or a raw one starting with
// HTTP/), with the status line ("200 OK") between them if there is one.
func pageExamples(t *testing.T, path string) []example {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type block struct {
		lang, text string
		line       int
		before     []string // the text lines between the previous block and this one
	}
	var blocks []block
	var cur *block
	var text []string
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{lang: strings.TrimPrefix(line, "```"), line: i + 1, before: text}
			text = nil
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		default:
			text = append(text, line)
		}
	}
	statusLine := regexp.MustCompile(`^(\d{3}) [A-Z]`)
	var out []example
	for i, bl := range blocks {
		if bl.lang != "bash" || !strings.HasPrefix(bl.text, "curl ") {
			continue
		}
		ex := example{where: fmt.Sprintf("%s:%d", filepath.Base(filepath.Dir(path))+"/"+filepath.Base(path), bl.line), command: bl.text, status: 200}
		if i+1 < len(blocks) {
			next := blocks[i+1]
			for _, l := range next.before {
				if m := statusLine.FindStringSubmatch(l); m != nil {
					ex.status, _ = strconv.Atoi(m[1])
				}
			}
			switch {
			case next.lang == "json":
				ex.kind, ex.want = "json", next.text
			case next.lang == "" && strings.HasPrefix(next.text, "HTTP/"):
				ex.kind, ex.want = "http", next.text
				ex.status, _ = strconv.Atoi(strings.Fields(next.text)[1])
			}
		}
		out = append(out, ex)
	}
	return out
}

// runCurl runs a page's curl command with bash, as a reader would paste it, asking curl to keep
// the answer's headers and body apart.
func runCurl(t *testing.T, command, key string) (int, http.Header, []byte) {
	t.Helper()
	dir := t.TempDir()
	hdr, body := filepath.Join(dir, "headers"), filepath.Join(dir, "body")
	command = strings.Replace(command, "curl ", fmt.Sprintf("curl -sS --max-time 60 -D %s -o %s ", hdr, body), 1)
	cmd := exec.Command("bash", "-c", command)
	cmd.Env = []string{"KILN_API_KEY=" + key, "PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s\n%s", err, command, out)
	}
	h, err := os.ReadFile(hdr)
	if err != nil {
		t.Fatal(err)
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(h)))
	first, err := tp.ReadLine()
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(first)
	if len(fields) < 2 {
		t.Fatalf("status line %q", first)
	}
	status, err := strconv.Atoi(fields[1])
	if err != nil {
		t.Fatalf("status line %q", first)
	}
	mh, err := tp.ReadMIMEHeader()
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	b, err := os.ReadFile(body)
	if err != nil {
		t.Fatal(err)
	}
	return status, http.Header(mh), b
}

// checkHTTPAnswer compares a raw answer the page shows (status line, headers, a stream) with the
// gateway's: the headers the page names are there, and a stream's first and last chunks have the
// page's shape and the stream ends as the page's does.
func checkHTTPAnswer(t *testing.T, want string, got http.Header, body []byte) {
	t.Helper()
	head, stream, _ := strings.Cut(want, "\n\n")
	for _, l := range strings.Split(head, "\n")[1:] {
		name, value, ok := strings.Cut(l, ": ")
		if !ok {
			continue
		}
		if got.Get(name) == "" {
			t.Errorf("header %s is missing", name)
		}
		if name == "Content-Type" && !strings.HasPrefix(got.Get(name), value) {
			t.Errorf("Content-Type %q, the page shows %q", got.Get(name), value)
		}
	}
	wantData, gotData := dataLines(stream), dataLines(string(body))
	if len(wantData) < 2 || len(gotData) < 2 {
		t.Fatalf("too few data lines: the page shows %d, the gateway sent %d\n%s", len(wantData), len(gotData), body)
	}
	if w, g := wantData[len(wantData)-1], gotData[len(gotData)-1]; w != g {
		t.Errorf("the stream ends with %q, the page shows %q", g, w)
	}
	for _, pair := range [][2]string{{wantData[0], gotData[0]}, {wantData[len(wantData)-2], gotData[len(gotData)-2]}} {
		if err := sameJSONShape(pair[0], pair[1]); err != nil {
			t.Errorf("chunk differs in shape from the page: %v\npage: %s\ngot:  %s", err, pair[0], pair[1])
		}
	}
}

func dataLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if d, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// sameJSONShape reports how got differs in shape from want: every member want shows is in got
// with a value of the same JSON kind (null matches any kind: the page cannot show every case),
// and arrays compare their first elements.
func sameJSONShape(want, got string) error {
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		return fmt.Errorf("the page's JSON: %v", err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		return fmt.Errorf("the answer's JSON: %v", err)
	}
	return shape("", w, g)
}

func shape(at string, w, g any) error {
	if w == nil || g == nil {
		return nil
	}
	switch w := w.(type) {
	case map[string]any:
		gm, ok := g.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: an object on the page, %T in the answer", at, g)
		}
		for k, wv := range w {
			gv, ok := gm[k]
			if !ok {
				return fmt.Errorf("%s.%s: missing from the answer", at, k)
			}
			if err := shape(at+"."+k, wv, gv); err != nil {
				return err
			}
		}
	case []any:
		ga, ok := g.([]any)
		if !ok {
			return fmt.Errorf("%s: an array on the page, %T in the answer", at, g)
		}
		if len(w) > 0 && len(ga) > 0 {
			return shape(at+"[0]", w[0], ga[0])
		}
	default:
		if fmt.Sprintf("%T", w) != fmt.Sprintf("%T", g) {
			return fmt.Errorf("%s: %T on the page, %T in the answer", at, w, g)
		}
	}
	return nil
}

// startGateway starts the built gateway as `make run` does — simulator, embedded store, demo
// organization — on free ports, and returns its base URL and the demo key it printed.
func startGateway(t *testing.T) (base, key string) {
	t.Helper()
	dir := t.TempDir()
	simAddr := freePort(t)
	catalogPath := filepath.Join(dir, "catalog.yaml")
	cat := strings.ReplaceAll(string(catalog.ReferenceYAML()), "127.0.0.1:8090", simAddr)
	if err := os.WriteFile(catalogPath, []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin)
	cmd.Env = []string{
		"KILN_ADDR=127.0.0.1:0", "KILN_SIMULATOR_ADDR=" + simAddr, "KILN_CATALOG=" + catalogPath,
		"KILN_DATA_DIR=" + filepath.Join(dir, "data"), "KILN_SHUTDOWN_GRACE=2s",
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second): // a hang guard, not a timing assertion
			_ = cmd.Process.Kill()
			<-done
		}
	})
	listen := regexp.MustCompile(`listening on (http://\S+/v1)`)
	keyLine := regexp.MustCompile(`export KILN_API_KEY=(kiln-[A-Za-z0-9]+)`)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listen.FindStringSubmatch(sc.Text()); m != nil {
				base = m[1]
			}
			if m := keyLine.FindStringSubmatch(sc.Text()); m != nil {
				key = m[1]
			}
			if strings.HasPrefix(sc.Text(), "OpenAI SDKs:") {
				close(ready)
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second): // a hang guard
		t.Fatalf("the gateway did not start; stderr:\n%s", stderr.String())
	}
	if base == "" || key == "" {
		t.Fatal("the gateway's banner named no address or key")
	}
	return base, key
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// firstGeneration makes one request and returns its generation id, for the examples that look
// one up.
func firstGeneration(t *testing.T, base, key string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/chat/completions",
		strings.NewReader(`{"model":"gpt-oss-120b","messages":[{"role":"user","content":"Hello!"}],"max_tokens":5}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	id := resp.Header.Get("X-Neocloud-Generation-Id")
	if resp.StatusCode != 200 || id == "" {
		t.Fatalf("status %d, generation id %q", resp.StatusCode, id)
	}
	return id
}
