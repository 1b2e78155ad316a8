package simulator

import (
	"cmp"
	"net/http"
	"sync/atomic"
	"time"
)

// Model is one model the simulator serves.
type Model struct {
	Name                     string // served model name, e.g. "Qwen/Qwen3-32B"
	ContextLength            int    // prompt plus completion tokens allowed; 0 means no limit
	RejectRequiredToolChoice bool   // answer tool_choice "required" with 500 plain text (as qwen3-32b on vLLM does)
	// Server is the software the model is served by: VLLM when empty, or SGLang.
	Server Software
	// CachedTokens is the server's cache-report flag (vLLM --enable-prompt-tokens-details,
	// SGLang --enable-cache-report): without it usage never reports cached prompt tokens.
	CachedTokens bool
}

// Config is what New needs.
type Config struct {
	Models []Model
	Now    func() time.Time // for "created"; time.Now when nil
	// Server shapes the errors no model answers (an unknown path or model, a body that does not
	// parse): VLLM when empty.
	Server Software
}

// Server is the simulated model server. It implements http.Handler and is safe for concurrent use.
type Server struct {
	server   Software
	models   map[string]Model
	names    []string // in Config order, for /v1/models
	now      func() time.Time
	requests atomic.Int64 // inference requests received, valid or not: each one's sequence number
	active   atomic.Int64
}

// maxBody bounds a request body; vLLM has no limit of its own, but a test server needs one.
const maxBody = 16 << 20

// New returns a Server for cfg. When two models share a name, the last one wins.
func New(cfg Config) *Server {
	s := &Server{server: cmp.Or(cfg.Server, VLLM), models: make(map[string]Model, len(cfg.Models)), now: cfg.Now}
	if s.now == nil {
		s.now = time.Now
	}
	for _, m := range cfg.Models {
		m.Server = cmp.Or(m.Server, VLLM)
		if _, dup := s.models[m.Name]; !dup {
			s.names = append(s.names, m.Name)
		}
		s.models[m.Name] = m
	}
	return s
}

// Active returns how many inference requests are being served right now, streams included. It
// drops as soon as a request ends, including when its client went away mid-stream.
func (s *Server) Active() int64 { return s.active.Load() }

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/chat/completions":
		s.inference(w, r, endpointChat)
	case "/v1/completions":
		s.inference(w, r, endpointCompletions)
	case "/v1/models":
		if !s.allow(w, r, http.MethodGet) {
			return
		}
		s.listModels(w)
	case "/health":
		if !s.allow(w, r, http.MethodGet) {
			return
		}
		w.WriteHeader(http.StatusOK)
	default:
		writeRequestError(w, s.server, &requestError{status: http.StatusNotFound, message: "Not Found"})
	}
}

// allow answers 405 unless r uses method (or HEAD for GET).
func (s *Server) allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	writeRequestError(w, s.server, &requestError{status: http.StatusMethodNotAllowed, message: "Method Not Allowed"})
	return false
}

func (s *Server) inference(w http.ResponseWriter, r *http.Request, ep endpoint) {
	if !s.allow(w, r, http.MethodPost) {
		return
	}
	seq := s.requests.Add(1)
	s.active.Add(1)
	// Deferred so that it also runs when drop_after aborts the handler with a panic.
	defer s.active.Add(-1)

	req, server, err := s.parse(r, ep)
	if id := r.Header.Get("X-Request-Id"); id != "" && server == VLLM {
		// As vLLM started with --enable-request-id-headers does (XRequestIdMiddleware in
		// vllm/entrypoints/openai/server_utils.py).
		w.Header().Set("X-Request-Id", id)
	}
	if err != nil {
		writeRequestError(w, server, err)
		return
	}
	s.serve(w, r, req, seq)
}

type modelEntry struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

func (s *Server) listModels(w http.ResponseWriter) {
	list := modelList{Object: "list", Data: []modelEntry{}}
	created := s.now().Unix()
	for _, name := range s.names {
		m := s.models[name]
		list.Data = append(list.Data, modelEntry{
			ID:          m.Name,
			Object:      "model",
			Created:     created,
			OwnedBy:     string(m.Server),
			Root:        m.Name,
			MaxModelLen: m.ContextLength,
		})
	}
	writeJSON(w, http.StatusOK, list)
}
