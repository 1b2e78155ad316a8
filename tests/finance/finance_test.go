// Package finance runs finance's path end to end on moto: the gateway binary on DynamoDB serves
// real requests, kilnctl finance export has moto export the tables to its S3 (data files without
// manifests, as moto writes them), and kilnctl finance report and reconcile read that export back
// over S3. Every endpoint reaches moto through the AWS SDK's own AWS_ENDPOINT_URL.
package finance

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/tests/internal/build"
	"github.com/neocloud/kiln/tests/internal/output"
)

var gatewayBin, kilnctlBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "kiln-finance-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bins, err := build.Commands(dir, "./functions/gateway", "./infra/kilnctl")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		gatewayBin, kilnctlBin = bins[0], bins[1]
		return m.Run()
	}())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

var (
	listenLine = regexp.MustCompile(`listening on (http://\S+/v1)`)
	keyLine    = regexp.MustCompile(`export KILN_API_KEY=(kiln-[A-Za-z0-9]+)`)
	genHeader  = "X-Neocloud-Generation-Id"
)

// gateway starts the gateway binary with env and returns its base URL and the demo key.
func gateway(t *testing.T, env []string) (baseURL, demoKey string) {
	t.Helper()
	cmd := exec.Command(gatewayBin)
	cmd.Env = env
	stdout, stderr := &output.Buffer{}, &output.Buffer{}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(stdout, pw), stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("gateway did not stop on SIGTERM")
		}
	})
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if m := listenLine.FindStringSubmatch(line); m != nil {
				baseURL = m[1]
			}
			if m := keyLine.FindStringSubmatch(line); m != nil {
				demoKey = m[1]
			}
			if strings.HasPrefix(line, "OpenAI SDKs:") {
				close(found)
				io.Copy(io.Discard, pr)
				return
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(90 * time.Second):
		t.Fatalf("gateway did not start:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	if baseURL == "" || demoKey == "" {
		t.Fatalf("no address or key in the banner:\n%s", stdout)
	}
	return baseURL, demoKey
}

// kilnctl runs the built kilnctl and returns its exit status and output.
func kilnctl(env []string, args ...string) (code int, stdout, stderr string) {
	cmd := exec.Command(kilnctlBin, args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		code = -1
		errOut.WriteString(err.Error())
	}
	return code, out.String(), errOut.String()
}

func mustKilnctl(t *testing.T, env []string, args ...string) string {
	t.Helper()
	code, out, errOut := kilnctl(env, args...)
	if code != 0 {
		t.Fatalf("kilnctl %s: exit %d\n%s\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// charge sends one request and returns its generation id and the usage.cost it was charged ("0"
// for a refused one).
func charge(t *testing.T, baseURL, key, path, body string) (gen string, cost money.Amount) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, baseURL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	gen = resp.Header.Get(genHeader)
	if gen == "" {
		t.Fatalf("%s: no %s (status %d)", path, genHeader, resp.StatusCode)
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var usage []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, line := range strings.Split(string(raw), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if ok && strings.Contains(data, `"usage"`) && strings.Contains(data, `"cost"`) {
				var chunk struct{ Usage json.RawMessage }
				json.Unmarshal([]byte(data), &chunk)
				usage = chunk.Usage
			}
		}
	} else if resp.StatusCode == 200 {
		var body struct{ Usage json.RawMessage }
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, raw)
		}
		usage = body.Usage
	}
	if usage == nil {
		return gen, 0
	}
	// usage.cost is a plain decimal JSON number; read it as the exact decimal it is.
	var u struct {
		Cost json.Number `json:"cost"`
	}
	if err := json.Unmarshal(usage, &u); err != nil {
		t.Fatalf("usage %s: %v", usage, err)
	}
	c, err := money.Parse(u.Cost.String())
	if err != nil {
		t.Fatalf("usage.cost %q: %v", u.Cost, err)
	}
	return gen, c
}

// TestFinanceOnMoto: what clients were charged is what the export's report says, the books
// reconcile, and after one debit is removed from the ledger the next export's reconciliation
// fails naming that request.
func TestFinanceOnMoto(t *testing.T) {
	ctx := t.Context()
	moto, err := dynamotest.StartMoto(ctx)
	if err != nil {
		t.Fatalf("cannot start moto: %v", err)
	}
	t.Cleanup(moto.Stop)

	dir := t.TempDir()
	sim := freeAddr(t)
	ref := strings.ReplaceAll(string(catalog.ReferenceYAML()), "127.0.0.1:8090", sim)
	catalog := filepath.Join(dir, "catalog.yaml")
	os.WriteFile(catalog, []byte(ref), 0o600)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"KILN_STORE=dynamodb", "KILN_TABLE_PREFIX=fin-", "AWS_REGION=us-east-1",
		// The SDK's own name for one endpoint for every service: DynamoDB and S3 alike.
		"AWS_ENDPOINT_URL=" + moto.Endpoint,
	}
	gwEnv := append(append([]string{}, env...), "KILN_ADDR=127.0.0.1:0", "KILN_SIMULATOR_ADDR="+sim,
		"KILN_CATALOG="+catalog, "KILN_DATA_DIR="+filepath.Join(dir, "data"), "KILN_SHUTDOWN_GRACE=2s")

	// dev create-tables on moto turns point-in-time recovery on.
	var tables struct {
		Endpoint string `json:"endpoint"`
		Tables   []struct {
			Name    string `json:"name"`
			Created bool   `json:"created"`
		} `json:"tables"`
		PointInTimeRecovery bool `json:"point_in_time_recovery"`
	}
	json.Unmarshal([]byte(mustKilnctl(t, env, "dev", "create-tables", "--json")), &tables)
	if tables.Endpoint != moto.Endpoint || len(tables.Tables) != 5 || !tables.PointInTimeRecovery {
		t.Fatalf("dev create-tables on moto: %+v", tables)
	}

	baseURL, demoKey := gateway(t, gwEnv)
	mustKilnctl(t, env, "org", "create", "--id", "org_fin", "--name", "Finance test")
	mustKilnctl(t, env, "credits", "add", "--org", "org_fin", "--usd", "5.00")
	var k struct {
		Key string `json:"key"`
	}
	json.Unmarshal([]byte(mustKilnctl(t, env, "key", "create", "--org", "org_fin", "--json")), &k)
	if k.Key == "" {
		t.Fatal("no key created")
	}

	charged := map[string]money.Amount{}
	gens := map[string][]string{}
	requests := 0
	send := func(org, key, path, body string) {
		gen, cost := charge(t, baseURL, key, path, body)
		charged[org] += cost
		gens[org] = append(gens[org], gen)
		requests++
	}
	for i := range 4 {
		send("org_demo", demoKey, "/chat/completions", fmt.Sprintf(`{"model":"gpt-oss-120b","messages":[{"role":"user","content":"hello number %d"}],"max_tokens":%d}`, i, 5+i))
		send("org_fin", k.Key, "/chat/completions", fmt.Sprintf(`{"model":"qwen3-32b","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"stream %d"}],"max_tokens":%d}`, i, 3+i))
	}
	send("org_fin", k.Key, "/completions", `{"model":"gpt-oss-120b","prompt":"Say this is a test","max_tokens":7}`)
	send("org_fin", k.Key, "/chat/completions", `{"model":"not-a-model","messages":[{"role":"user","content":"x"}]}`) // 404: recorded, no cost
	for org, c := range charged {
		if c <= 0 {
			t.Fatalf("%s was charged %s", org, c)
		}
	}

	// Settlement and the in-process fold run after the responses: wait until the aggregates
	// have every request.
	today := time.Now().UTC().Format(time.DateOnly)
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	deadline := time.Now().Add(60 * time.Second)
	for org := range charged {
		for {
			var r struct {
				Total struct {
					Requests int `json:"requests"`
				} `json:"total"`
			}
			json.Unmarshal([]byte(mustKilnctl(t, env, "usage", "--org", org, "--from", yesterday, "--to", today, "--by", "day", "--json")), &r)
			if r.Total.Requests == len(gens[org]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d requests aggregated, want %d", org, r.Total.Requests, len(gens[org]))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("kilnlocal", "kilnlocal", "")}
	s3c := s3.NewFromConfig(cfg, func(o *s3.Options) { o.BaseEndpoint = aws.String(moto.Endpoint); o.UsePathStyle = true })
	if _, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("kiln-finance")}); err != nil {
		t.Fatal(err)
	}

	// Export: the three tables, awaited.
	var exp struct {
		Location string `json:"location"`
		Exports  []struct {
			Table    string `json:"table"`
			Status   string `json:"status"`
			Location string `json:"location"`
		} `json:"exports"`
	}
	code, out, errOut := kilnctl(env, "finance", "export", "--bucket", "kiln-finance", "--prefix", "kiln/run1", "--poll", "100ms", "--json")
	if code != 0 {
		t.Fatalf("finance export: exit %d\n%s\n%s", code, out, errOut)
	}
	json.Unmarshal([]byte(out), &exp)
	if exp.Location != "s3://kiln-finance/kiln/run1/" || len(exp.Exports) != 3 || exp.Exports[1].Table != "fin-usage" ||
		exp.Exports[1].Status != "COMPLETED" || exp.Exports[1].Location != "s3://kiln-finance/kiln/run1/fin-usage/" {
		t.Fatalf("finance export: %s", out)
	}
	if !strings.Contains(errOut, "export of fin-ledger started") {
		t.Errorf("no progress on stderr: %q", errOut)
	}

	// The report: one row per request, and per organization exactly what its clients were charged.
	rows, err := csv.NewReader(strings.NewReader(mustKilnctl(t, env, "finance", "report", "--export", exp.Location,
		"--from", yesterday, "--to", today, "--csv"))).ReadAll()
	if err != nil || len(rows) != requests+1 || rows[0][0] != "generation_id" || rows[0][12] != "cost" {
		t.Fatalf("report: %d rows, %v\n%v", len(rows), err, rows)
	}
	reported := map[string]money.Amount{}
	for _, r := range rows[1:] {
		c, err := money.Parse(r[12])
		if err != nil {
			t.Fatalf("cost cell %q: %v", r[12], err)
		}
		reported[r[1]] += c
	}
	for org, c := range charged {
		if reported[org] != c {
			t.Errorf("%s: report says %s, clients were charged %s", org, reported[org], c)
		}
	}
	byOrg, _ := csv.NewReader(strings.NewReader(mustKilnctl(t, env, "finance", "report", "--export", exp.Location,
		"--from", yesterday, "--to", today, "--by", "org", "--csv"))).ReadAll()
	for _, r := range byOrg[1:] {
		if c, _ := money.Parse(r[5]); c != charged[r[0]] {
			t.Errorf("--by org: %s %s, charged %s", r[0], r[5], charged[r[0]])
		}
	}

	// Reconcile: every figure agrees.
	code, out, errOut = kilnctl(env, "finance", "reconcile", "--export", exp.Location, "--from", yesterday, "--to", today)
	if code != 0 || !strings.Contains(out, "every figure agrees") {
		t.Fatalf("reconcile of the gateway's books: exit %d\n%s\n%s", code, out, errOut)
	}

	// Remove one debit from the ledger, export again: the reconciliation names that request.
	db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(moto.Endpoint) })
	victim := gens["org_fin"][1]
	if _, err := db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String("fin-ledger"),
		Key: map[string]types.AttributeValue{
			"org_id": &types.AttributeValueMemberS{Value: "org_fin"}, "entry_id": &types.AttributeValueMemberS{Value: victim},
		},
		ConditionExpression: aws.String("attribute_exists(entry_id)"),
	}); err != nil {
		t.Fatalf("delete the debit of %s: %v", victim, err)
	}
	mustKilnctl(t, env, "finance", "export", "--bucket", "kiln-finance", "--prefix", "kiln/run2", "--poll", "100ms")
	code, out, errOut = kilnctl(env, "finance", "reconcile", "--export", "s3://kiln-finance/kiln/run2", "--from", yesterday, "--to", today)
	if code != 3 || !strings.Contains(out, "usage_without_debit") || !strings.Contains(out, victim) || strings.Count(out, "gen-") != 1 {
		t.Fatalf("reconcile after removing the debit of %s: exit %d\n%s\n%s", victim, code, out, errOut)
	}

	// Both exports under one prefix are refused, not summed twice.
	code, _, errOut = kilnctl(env, "finance", "report", "--export", "s3://kiln-finance/kiln", "--from", yesterday, "--to", today)
	if code != 1 || !strings.Contains(errOut, "two exports") {
		t.Errorf("report over two exports: exit %d, %q", code, errOut)
	}
}
