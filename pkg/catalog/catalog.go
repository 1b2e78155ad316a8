// Package catalog holds the models the gateway serves — their backends, prices and
// capabilities — loaded from a versioned YAML file and validated as a whole at start.
package catalog

import "github.com/neocloud/kiln/pkg/money"

// Catalog is a loaded, validated catalog. It is read-only after Parse.
type Catalog struct {
	Version int
	Models  []*Model // in file order
	byID    map[string]*Model
}

// Model is one public model. Its yaml tags are the catalog file's keys; prices are read apart
// (parse.go), so that a price is never a YAML float.
type Model struct {
	ID                string       `yaml:"id"`
	OwnedBy           string       `yaml:"owned_by"`
	Created           int64        `yaml:"created"` // Unix seconds, shown in /v1/models
	ContextLength     int          `yaml:"context_length"`
	InputModalities   []string     `yaml:"input_modalities"`    // "text", "image"
	ParallelToolCalls bool         `yaml:"parallel_tool_calls"` // whether parallel_tool_calls is honoured
	ForcedToolChoice  bool         `yaml:"forced_tool_choice"`  // false: tool_choice "required" or a named function is refused with 400
	IgnoreEOS         bool         `yaml:"ignore_eos"`          // false: ignore_eos: true on chat completions is refused with 400
	Pricing           money.Prices `yaml:"-"`
	Backends          []Backend    `yaml:"backends"`
}

// Backend is one model server that serves a Model.
type Backend struct {
	Name            string `yaml:"name"`              // unique in the catalog; appears in usage events and logs
	URL             string `yaml:"url"`               // base URL ending in /v1, e.g. http://10.0.0.5:8000/v1
	Model           string `yaml:"model"`             // the model name the backend expects; the public ID when empty in the file
	Server          Server `yaml:"server"`            // the model server's software: whose protocol it speaks
	ContinuousUsage bool   `yaml:"continuous_usage"`  // the backend reports usage on every streamed chunk (continuous_usage_stats)
	CachedTokens    bool   `yaml:"cached_tokens"`     // the server reports cached prompt tokens (vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report)
	EchoesRequestID bool   `yaml:"echoes_request_id"` // the server answers with the request's X-Request-Id (vLLM --enable-request-id-headers)
	APIKeyEnv       string `yaml:"api_key_env"`       // optional: name of the environment variable holding the backend's bearer token
}

// Server is the software a backend runs. vLLM and SGLang speak the same OpenAI protocol with
// differences the gateway and the simulator follow: error bodies, usage details, stream endings.
type Server string

const (
	ServerVLLM   Server = "vllm"
	ServerSGLang Server = "sglang"
)

// Servers are the values a backend's server may take; the first is the default.
var Servers = []Server{ServerVLLM, ServerSGLang}

// Model returns the model with this public id.
func (c *Catalog) Model(id string) (*Model, bool) {
	m, ok := c.byID[id]
	return m, ok
}
