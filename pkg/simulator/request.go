package simulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

type endpoint int

const (
	endpointChat endpoint = iota
	endpointCompletions
)

// naturalLength is where the simulated model stops of its own accord (finish_reason "stop")
// when neither max_tokens nor a tokens directive ends its answer sooner.
const naturalLength = 16

// request is a validated inference request: only what the simulator acts on.
type request struct {
	endpoint           endpoint
	model              Model
	prompts            []int // the tokens of each prompt: one for chat, one per prompt of an array
	maxTokens          int   // -1 when the request sets none
	n                  int   // choices per prompt
	logprobs           int   // the logprobs asked for: top_logprobs on chat, logprobs on completions
	stream             bool
	includeUsage       bool
	continuousUsage    bool // include_usage and continuous_usage_stats, as vLLM requires both
	requiredToolChoice bool
	directives         directives
}

// commonRequest holds the fields both endpoints read. Everything else in a body is ignored.
type commonRequest struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Logprobs            json.RawMessage `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
}

type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

type chatRequest struct {
	commonRequest
	Messages []chatRequestMessage `json:"messages"`
}

type chatRequestMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type completionRequest struct {
	commonRequest
	Prompt json.RawMessage `json:"prompt"`
}

// parse reads and validates the body of an inference request. It also returns the software
// whose error body a refusal takes: the model's, once the body names a known one.
func (s *Server) parse(r *http.Request, ep endpoint) (*request, Software, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, s.server, &requestError{status: http.StatusRequestEntityTooLarge, message: fmt.Sprintf("Request body larger than %d bytes.", maxBody)}
		}
		return nil, s.server, badRequest("Could not read the request body.")
	}

	// A prompt that cannot be counted is refused after the model is found: in the model's words.
	var (
		common     *commonRequest
		prompts    []int
		text       string // where directives are read
		promptErr  error
		toolResult bool // the last message is a tool's result, which the model answers in text
	)
	switch ep {
	case endpointChat:
		var cr chatRequest
		if err := decode(body, &cr); err != nil {
			return nil, s.serverOf(body), err
		}
		common = &cr.commonRequest
		prompts, text, promptErr = chatPrompt(cr.Messages)
		toolResult = len(cr.Messages) > 0 && cr.Messages[len(cr.Messages)-1].Role == "tool"
	default:
		var cr completionRequest
		if err := decode(body, &cr); err != nil {
			return nil, s.serverOf(body), err
		}
		common = &cr.commonRequest
		prompts, text, promptErr = completionPrompt(cr.Prompt)
	}

	if common.Model == "" {
		return nil, s.server, badRequest("model: Field required")
	}
	model, ok := s.models[common.Model]
	if !ok {
		return nil, s.server, &requestError{status: http.StatusNotFound, message: fmt.Sprintf("The model `%s` does not exist.", common.Model)}
	}
	if promptErr != nil {
		return nil, model.Server, promptErr
	}
	req := &request{endpoint: ep, model: model, prompts: prompts, maxTokens: -1, n: 1}
	if err := req.readOptions(common); err != nil {
		return nil, model.Server, err
	}
	if err := req.checkModelValidators(common, body); err != nil {
		return nil, model.Server, err
	}
	if len(req.prompts)*req.n > maxChoices {
		return nil, model.Server, badRequest("n times the number of prompts must be at most %d, got %d.", maxChoices, len(req.prompts)*req.n)
	}
	if req.directives, err = parseDirectives(text); err != nil {
		return nil, model.Server, err
	}
	if toolResult {
		// The directive stays in the user's message for the whole conversation; a model answers
		// the result of the call it asked for, so that a client's tool loop ends.
		req.directives.toolCall = ""
	}
	if (req.directives.toolCall != "" || req.directives.reasoning > 0) && ep != endpointChat {
		return nil, model.Server, badRequest("The tool_call and reasoning directives are only valid on /v1/chat/completions.")
	}
	return req, model.Server, nil
}

// serverOf is the software of the model a body that did not decode names, if it names one.
func (s *Server) serverOf(body []byte) Software {
	var m struct {
		Model string `json:"model"`
	}
	if json.Unmarshal(body, &m) == nil {
		if model, ok := s.models[m.Model]; ok {
			return model.Server
		}
	}
	return s.server
}

func (req *request) readOptions(c *commonRequest) error {
	switch {
	case c.MaxCompletionTokens != nil:
		req.maxTokens = *c.MaxCompletionTokens
	case c.MaxTokens != nil:
		req.maxTokens = *c.MaxTokens
	}
	if (c.MaxCompletionTokens != nil || c.MaxTokens != nil) && req.maxTokens < 1 {
		return badRequest("max_tokens must be at least 1, got %d.", req.maxTokens)
	}
	if c.N != nil {
		if *c.N < 1 || *c.N > maxChoices {
			return badRequest("n must be from 1 to %d, got %d.", maxChoices, *c.N)
		}
		req.n = *c.N
	}
	switch {
	case c.TopLogprobs != nil:
		req.logprobs = *c.TopLogprobs
	case len(c.Logprobs) > 0:
		_ = json.Unmarshal(c.Logprobs, &req.logprobs) // chat's boolean leaves it 0
	}
	req.stream = c.Stream
	if o := c.StreamOptions; o != nil {
		if !req.stream {
			return badRequest("Stream options can only be defined when `stream=True`.")
		}
		req.includeUsage = o.IncludeUsage
		req.continuousUsage = o.IncludeUsage && o.ContinuousUsageStats
	}
	var choice string
	req.requiredToolChoice = json.Unmarshal(c.ToolChoice, &choice) == nil && choice == "required"
	return nil
}

// decode parses a request body, answering the way vLLM reports validation errors: a 400 that
// names the field.
func decode(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return badRequest("Input should be a valid dictionary: the body must be a JSON object.")
		}
		// encoding/json names the embedded struct in the path; the body has no such level.
		field := strings.TrimPrefix(typeErr.Field, "commonRequest.")
		return badRequest("%s: Input should be a valid %s", field, jsonKind(typeErr.Type.Kind().String()))
	}
	return badRequest("JSON decode error: %v", err)
}

// jsonKind names a Go kind in the words of vLLM's validation messages.
func jsonKind(kind string) string {
	switch {
	case kind == "bool":
		return "boolean"
	case strings.HasPrefix(kind, "int"):
		return "integer"
	case kind == "slice":
		return "list"
	case kind == "struct", kind == "map":
		return "dictionary"
	}
	return kind
}

// chatPrompt counts the words of every message, the one prompt of a chat, and returns the text
// of the last user message, where directives are read.
func chatPrompt(msgs []chatRequestMessage) (tokens []int, lastUser string, err error) {
	if msgs == nil {
		return nil, "", badRequest("messages: Field required")
	}
	n := 0
	for i, m := range msgs {
		text, err := contentText(m.Content)
		if err != nil {
			return nil, "", badRequest("messages[%d].content: %v", i, err)
		}
		n += len(strings.Fields(text))
		if m.Role == "user" {
			lastUser = text
		}
	}
	return []int{n}, lastUser, nil
}

// contentText is a message content's text: the string itself, or the "text" of every content
// part, one per line. Parts without text (images) add nothing.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("Input should be a valid string or a list of content parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Text != nil {
			texts = append(texts, *p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// maxChoices bounds n × prompts, so that a request cannot make the simulator hold much.
const maxChoices = 128

// completionPrompt counts a completions prompt, in each of the four shapes vLLM accepts: one
// count per prompt (an array of strings or of token-id lists is several prompts, each answered
// by its own choices). It returns the text where directives are read: the prompt, or the last
// string of an array.
func completionPrompt(raw json.RawMessage) (tokens []int, text string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, "", badRequest("prompt: Field required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []int{len(strings.Fields(one))}, one, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		if len(many) == 0 || len(many) > maxChoices {
			return nil, "", badRequest("prompt: the list must hold from 1 to %d prompts", maxChoices)
		}
		for _, p := range many {
			tokens = append(tokens, len(strings.Fields(p)))
		}
		return tokens, many[len(many)-1], nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return []int{len(ids)}, "", nil
	}
	var batches [][]int
	if json.Unmarshal(raw, &batches) == nil && len(batches) > 0 && len(batches) <= maxChoices {
		for _, b := range batches {
			tokens = append(tokens, len(b))
		}
		return tokens, "", nil
	}
	return nil, "", badRequest("prompt: Input should be a valid string, list of strings, list of token ids or list of lists of token ids")
}
