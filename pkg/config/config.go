// Package config reads Kiln's configuration from the environment once, at start, and reports
// every problem together (contract section 11).
package config

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/neocloud/kiln/pkg/awsenv"
)

// Store kinds.
const (
	StoreSQLite   = "sqlite"
	StoreDynamoDB = "dynamodb"
)

// Config is the whole configuration of the gateway and kilnctl.
type Config struct {
	Addr             string        // KILN_ADDR: listen address off Lambda
	DataDir          string        // KILN_DATA_DIR: embedded store directory
	Store            string        // KILN_STORE: sqlite or dynamodb
	Catalog          string        // KILN_CATALOG: catalog file; "" is the embedded reference catalog
	Keepalive        time.Duration // KILN_KEEPALIVE: backend silence before a ": keepalive" comment
	MaxBody          int64         // KILN_MAX_BODY: request body limit in bytes
	TablePrefix      string        // KILN_TABLE_PREFIX
	DynamoDBEndpoint string        // KILN_DYNAMODB_ENDPOINT, else AWS_ENDPOINT_URL_DYNAMODB, else AWS_ENDPOINT_URL
	S3Endpoint       string        // AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (kilnctl finance)
	Region           string        // AWS_REGION
	Simulator        string        // KILN_SIMULATOR_ADDR: start the built-in model simulator there ("" = don't)
	ConnectTimeout   time.Duration // KILN_BACKEND_CONNECT_TIMEOUT
	HeaderTimeout    time.Duration // KILN_BACKEND_HEADER_TIMEOUT: wait for a backend's response headers
	// Client connections off Lambda (contract section 2, step 0).
	RequestHeaderTimeout time.Duration // KILN_HEADER_TIMEOUT: a request's line and headers must arrive within it
	RequestBodyTimeout   time.Duration // KILN_BODY_TIMEOUT: the longest gap between bytes of a request body
	IdleTimeout          time.Duration // KILN_IDLE_TIMEOUT: a kept-alive connection with no request is closed after it
	LeaseTTL             time.Duration // KILN_LEASE_TTL: in-flight slot lease
	CacheTTL             time.Duration // KILN_CACHE_TTL: how long keys (with their organization's status) and maintenance are cached
	LogLevel             slog.Level    // KILN_LOG_LEVEL: debug, info (the zero Level), warn, error
	OnLambda             bool          // AWS_LAMBDA_RUNTIME_API is set
	DemoOrgCredits       string        // KILN_DEMO_CREDITS: credits given to the demo organization at first start
	ShutdownGrace        time.Duration // KILN_SHUTDOWN_GRACE: how long open streams may finish on SIGTERM
	SettleReserve        time.Duration // KILN_SETTLE_RESERVE: stop streams this long before a deadline
	AdmitTimeout         time.Duration // KILN_ADMIT_TIMEOUT: admission's store deadline, then 503
	SettleWait           time.Duration // KILN_SETTLE_WAIT: how long an answer's end waits for its settlement
	BackendSecret        string        // KILN_BACKEND_SECRET: Secrets Manager secret (name or ARN) of the backends' token
	MetricsNamespace     string        // KILN_METRICS_NAMESPACE: CloudWatch namespace of the per-request metrics; "" writes none
}

// BackendSecretEnv is the api_key_env name that KILN_BACKEND_SECRET's token stands for: catalog
// backends that name it get the secret's current value.
const BackendSecretEnv = "KILN_BACKEND_API_KEY"

// Load reads the configuration through getenv (os.Getenv in main, a map in tests).
func Load(getenv func(string) string) (Config, error) {
	var errs []error
	str := func(name, def string) string { return cmp.Or(getenv(name), def) }
	dur := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive duration such as 15s", name, v))
			return def
		}
		return d
	}
	c := Config{
		OnLambda:             getenv("AWS_LAMBDA_RUNTIME_API") != "",
		Addr:                 str("KILN_ADDR", "127.0.0.1:8080"),
		DataDir:              str("KILN_DATA_DIR", "./.kiln"),
		Catalog:              getenv("KILN_CATALOG"),
		Keepalive:            dur("KILN_KEEPALIVE", 15*time.Second),
		TablePrefix:          str("KILN_TABLE_PREFIX", "kiln-"),
		DynamoDBEndpoint:     awsenv.Endpoint(getenv, "KILN_DYNAMODB_ENDPOINT", awsenv.DynamoDB),
		S3Endpoint:           awsenv.Endpoint(getenv, "", awsenv.S3),
		Region:               getenv("AWS_REGION"),
		Simulator:            getenv("KILN_SIMULATOR_ADDR"),
		ConnectTimeout:       dur("KILN_BACKEND_CONNECT_TIMEOUT", 10*time.Second),
		HeaderTimeout:        dur("KILN_BACKEND_HEADER_TIMEOUT", 120*time.Second),
		RequestHeaderTimeout: dur("KILN_HEADER_TIMEOUT", 10*time.Second),
		RequestBodyTimeout:   dur("KILN_BODY_TIMEOUT", 10*time.Second),
		IdleTimeout:          dur("KILN_IDLE_TIMEOUT", 120*time.Second),
		LeaseTTL:             dur("KILN_LEASE_TTL", 60*time.Second),
		CacheTTL:             dur("KILN_CACHE_TTL", 2*time.Second),
		DemoOrgCredits:       str("KILN_DEMO_CREDITS", "10.00"),
		ShutdownGrace:        dur("KILN_SHUTDOWN_GRACE", 30*time.Second),
		SettleReserve:        dur("KILN_SETTLE_RESERVE", 5*time.Second),
		AdmitTimeout:         dur("KILN_ADMIT_TIMEOUT", 2*time.Second),
		SettleWait:           dur("KILN_SETTLE_WAIT", 10*time.Second),
		BackendSecret:        getenv("KILN_BACKEND_SECRET"),
		MetricsNamespace:     getenv("KILN_METRICS_NAMESPACE"),
	}
	def := StoreSQLite
	if c.OnLambda {
		def = StoreDynamoDB
	}
	c.Store = str("KILN_STORE", def)
	if c.Store != StoreSQLite && c.Store != StoreDynamoDB {
		errs = append(errs, fmt.Errorf("KILN_STORE=%q: want sqlite or dynamodb", c.Store))
	}
	c.MaxBody = 5 << 20
	if v := getenv("KILN_MAX_BODY"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("KILN_MAX_BODY=%q: want a positive number of bytes", v))
		} else {
			c.MaxBody = n
		}
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("KILN_ADDR=%q: want host:port", c.Addr))
	}
	if c.Simulator != "" {
		if _, _, err := net.SplitHostPort(c.Simulator); err != nil {
			errs = append(errs, fmt.Errorf("KILN_SIMULATOR_ADDR=%q: want host:port", c.Simulator))
		}
	}
	// Read by slog, as the aggregator reads it, but only slog's four names (in any case): an
	// offset such as "error+4" would silence errors too.
	levels := []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}
	if v := getenv("KILN_LOG_LEVEL"); v != "" && (c.LogLevel.UnmarshalText([]byte(v)) != nil || !slices.Contains(levels, c.LogLevel)) {
		errs = append(errs, fmt.Errorf("KILN_LOG_LEVEL=%q: want debug, info, warn or error", v))
	}
	if c.CacheTTL > 5*time.Second {
		errs = append(errs, fmt.Errorf("KILN_CACHE_TTL=%s: at most 5s, so that revocations and suspensions reach a running gateway within 5 s", c.CacheTTL))
	}
	// The gateway no longer publishes usage events: the usage table is the event (its DynamoDB
	// stream feeds the aggregator). A setting of the old publisher is refused, so that nobody
	// believes events still go where it says.
	for _, name := range []string{"KILN_EVENT_BUS", "KILN_EVENTBRIDGE_ENDPOINT", "KILN_USAGE_SWEEP"} {
		if getenv(name) != "" {
			errs = append(errs, fmt.Errorf("%s is no longer read: the gateway publishes nothing per request; usage reaches the aggregator through the usage table's DynamoDB stream (on AWS the stack's EventBridge Pipe; locally the gateway reads the stream itself; the embedded store folds at settlement). Unset it", name))
		}
	}
	if c.LeaseTTL < 3*time.Second {
		errs = append(errs, fmt.Errorf("KILN_LEASE_TTL=%s: at least 3s", c.LeaseTTL))
	}
	return c, errors.Join(errs...)
}
