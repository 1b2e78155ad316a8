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

// Model is one public model.
type Model struct {
	ID                string
	OwnedBy           string
	Created           int64 // Unix seconds, shown in /v1/models
	ContextLength     int
	InputModalities   []string // "text", "image"
	ParallelToolCalls bool     // whether parallel_tool_calls is honoured
	ForcedToolChoice  bool     // false: tool_choice "required" or a named function is refused with 400
	IgnoreEOS         bool     // false: ignore_eos: true on chat completions is refused with 400
	Pricing           money.Prices
	Backends          []Backend
}

// Backend is one model server that serves a Model.
type Backend struct {
	Name            string // unique in the catalog; appears in usage events and logs
	URL             string // base URL ending in /v1, e.g. http://10.0.0.5:8000/v1
	Model           string // the model name the backend expects; the public ID when empty in the file
	Server          Server // the model server's software: whose protocol it speaks
	ContinuousUsage bool   // the backend reports usage on every streamed chunk (continuous_usage_stats)
	CachedTokens    bool   // the server reports cached prompt tokens (vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report)
	APIKeyEnv       string // optional: name of the environment variable holding the backend's bearer token
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
