package config

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaults(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.DataDir != "./.kiln" || c.Store != StoreSQLite || c.Keepalive != 15*time.Second ||
		c.MaxBody != 5242880 || c.TablePrefix != "kiln-" || c.HeaderTimeout != 120*time.Second || c.ConnectTimeout != 10*time.Second ||
		c.LeaseTTL != 60*time.Second || c.Simulator != "" || c.OnLambda {
		t.Errorf("defaults: %+v", c)
	}
	c, err = Load(env(map[string]string{"AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001"}))
	if err != nil || !c.OnLambda || c.Store != StoreDynamoDB {
		t.Errorf("on Lambda the store defaults to dynamodb: %+v, %v", c, err)
	}
}

func TestEveryProblemReportedTogether(t *testing.T) {
	_, err := Load(env(map[string]string{
		"KILN_STORE":     "postgres",
		"KILN_KEEPALIVE": "soon",
		"KILN_MAX_BODY":  "-1",
		"KILN_ADDR":      "8080",
		"KILN_CACHE_TTL": "1m",
		"KILN_LOG_LEVEL": "loud",
	}))
	if err == nil {
		t.Fatal("want errors")
	}
	for _, name := range []string{"KILN_STORE", "KILN_KEEPALIVE", "KILN_MAX_BODY", "KILN_ADDR", "KILN_CACHE_TTL", "KILN_LOG_LEVEL"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s not reported in:\n%v", name, err)
		}
	}
}

func TestOverrides(t *testing.T) {
	c, err := Load(env(map[string]string{"KILN_KEEPALIVE": "250ms", "KILN_MAX_BODY": "1024", "KILN_SIMULATOR_ADDR": "127.0.0.1:9999"}))
	if err != nil || c.Keepalive != 250*time.Millisecond || c.MaxBody != 1024 || c.Simulator != "127.0.0.1:9999" {
		t.Errorf("%+v, %v", c, err)
	}
}

// TestEndpointsFollowTheSDKConvention: the AWS SDK's AWS_ENDPOINT_URL and
// AWS_ENDPOINT_URL_<SERVICE> set the endpoints too, after Kiln's own names.
func TestEndpointsFollowTheSDKConvention(t *testing.T) {
	c, err := Load(env(map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}))
	if err != nil || c.DynamoDBEndpoint != "http://127.0.0.1:5000" || c.S3Endpoint != "http://127.0.0.1:5000" {
		t.Errorf("AWS_ENDPOINT_URL: %+v, %v", c, err)
	}
	c, err = Load(env(map[string]string{
		"AWS_ENDPOINT_URL":          "http://127.0.0.1:5000",
		"AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000",
		"AWS_ENDPOINT_URL_S3":       "http://127.0.0.1:9000",
	}))
	if err != nil || c.DynamoDBEndpoint != "http://127.0.0.1:8000" || c.S3Endpoint != "http://127.0.0.1:9000" {
		t.Errorf("per service: %+v, %v", c, err)
	}
}

// TestPublisherSettingsRefused: the settings of the usage publisher that the usage table's stream
// replaced are refused by name, so that nobody believes events still go to a bus.
func TestPublisherSettingsRefused(t *testing.T) {
	_, err := Load(env(map[string]string{"KILN_EVENT_BUS": "kiln-usage", "KILN_EVENTBRIDGE_ENDPOINT": "http://127.0.0.1:5000", "KILN_USAGE_SWEEP": "1m"}))
	for _, name := range []string{"KILN_EVENT_BUS", "KILN_EVENTBRIDGE_ENDPOINT", "KILN_USAGE_SWEEP"} {
		if err == nil || !strings.Contains(err.Error(), name+" is no longer read") {
			t.Errorf("%s not refused: %v", name, err)
		}
	}
}

// TestLogLevelIsOneOfFour: KILN_LOG_LEVEL takes slog's four names, in any case, and no offset,
// which could silence errors.
func TestLogLevelIsOneOfFour(t *testing.T) {
	for v, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "Warn": slog.LevelWarn, "error": slog.LevelError} {
		if c, err := Load(env(map[string]string{"KILN_LOG_LEVEL": v})); err != nil || c.LogLevel != want {
			t.Errorf("KILN_LOG_LEVEL=%s: %v, %v; want %v", v, c.LogLevel, err, want)
		}
	}
	for _, v := range []string{"error+4", "debug-4", "loud"} {
		if _, err := Load(env(map[string]string{"KILN_LOG_LEVEL": v})); err == nil || !strings.Contains(err.Error(), "KILN_LOG_LEVEL") {
			t.Errorf("KILN_LOG_LEVEL=%s: %v; want refused", v, err)
		}
	}
}
