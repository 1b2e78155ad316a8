package simulator

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Software is the model server a simulated model behaves like.
type Software string

const (
	// VLLM is today's vLLM (the default), read from vllm-project/vllm:
	// vllm/entrypoints/openai/engine/protocol.py (ErrorInfo, UsageInfo) at 040a2cc2a629,
	// vllm/entrypoints/serve/utils/error_response.py at 1c6ebf2c6b4f,
	// vllm/entrypoints/serve/utils/api_utils.py (get_max_tokens, should_include_usage) at 00a5fdd20935,
	// vllm/entrypoints/openai/chat_completion/serving.py at 006c49d485f9,
	// vllm/sampling_params.py (_validate_logprobs) at db573835d3ef.
	VLLM Software = "vllm"
	// SGLang is SGLang's OpenAI server, read from sgl-project/sglang:
	// python/sglang/srt/entrypoints/openai/serving_base.py at c5695a4be1c4,
	// python/sglang/srt/entrypoints/openai/serving_chat.py at 0c078e6f4268,
	// python/sglang/srt/entrypoints/openai/serving_completions.py at 7190e6fe8cfd,
	// python/sglang/srt/entrypoints/openai/usage_processor.py at 9e738dbafab3,
	// python/sglang/srt/managers/tokenizer_manager.py (_validate_one_request) at c60799d0eb1b.
	SGLang Software = "sglang"
)

// maxLogprobs is vLLM's default --max-logprobs.
const maxLogprobs = 20

// requestError is a request the simulator refuses, answered with the server's error body. When
// inEngine is set the server finds the problem only once generation has started: a streaming
// request then gets a 200 stream whose only event is the error (vLLM's engine validates sampling
// parameters there; SGLang's tokenizer manager checks the context length there).
type requestError struct {
	status   int
	message  string
	param    string // "" for null
	value    string // the rejected value vLLM's VLLMValidationError names; "" for none
	inEngine bool
}

// text is the message as the server writes it: vLLM's VLLMValidationError appends
// " (parameter=P, value=V)" to its message (vllm/exceptions.py at f984edf698e8).
func (s Software) text(e *requestError) string {
	if s == SGLang || e.param == "" {
		return e.message
	}
	extra := "parameter=" + e.param
	if e.value != "" {
		extra += ", value=" + e.value
	}
	return e.message + " (" + extra + ")"
}

func (e *requestError) Error() string { return e.message }

func badRequest(format string, args ...any) *requestError {
	return &requestError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}
}

// errorType names a status the way both servers do: 400 BadRequestError, 404 NotFoundError,
// 501 NotImplementedError, 500 InternalServerError. Every status the simulator answers has a
// text (the directives accept no other).
func errorType(status int) string {
	if status == http.StatusInternalServerError {
		return "InternalServerError"
	}
	return strings.NewReplacer(" ", "", "-", "").Replace(http.StatusText(status)) + "Error"
}

// errorBody is the body of an error answered with an HTTP status. vLLM nests it since v0.10.1
// (vLLM PR #22099): {"error":{"message","type","param","code"}}, code the status as a number.
// SGLang sends the flat {"object":"error","message","type","param","code"}.
func (s Software) errorBody(e *requestError) []byte {
	if s == SGLang {
		return s.errorJSON(`{"object":"error","message":%s,"type":%s,"param":%s,"code":%d}`, e, e.param)
	}
	return s.errorJSON(`{"error":{"message":%s,"type":%s,"param":%s,"code":%d}}`, e, e.param)
}

// streamErrorEvent is the data of the error event a stream ends with (then [DONE]): the same
// object inside {"error": ...}, written by Python's json.dumps, whose separators have spaces.
// SGLang's streaming error never names a param.
func (s Software) streamErrorEvent(e *requestError) []byte {
	if s == SGLang {
		return s.errorJSON(`{"error": {"object": "error", "message": %s, "type": %s, "param": %s, "code": %d}}`, e, "")
	}
	return s.errorJSON(`{"error": {"message": %s, "type": %s, "param": %s, "code": %d}}`, e, e.param)
}

// errorJSON fills format with e's message (as s writes it), type, param (null when "") and code.
func (s Software) errorJSON(format string, e *requestError, param string) []byte {
	p := []byte("null")
	if param != "" {
		p = marshal(param)
	}
	return fmt.Appendf(nil, format, marshal(s.text(e)), marshal(errorType(e.status)), p, e.status)
}

// checkContext applies the server's context-length rules to each prompt of a request, and sets
// the completion limit of a request that gave none. vLLM (the renderer and get_max_tokens) refuses
// a prompt longer than the context, refuses a max_tokens that does not fit beside the prompt, and
// lowers a missing one to what fits; it does so before any stream starts. SGLang's tokenizer
// manager refuses a prompt of the context's length or more, and a max_tokens whose sum with the
// prompt reaches the context, once generation has started.
func (req *request) checkContext() *requestError {
	limit := req.model.ContextLength
	if limit <= 0 {
		return nil
	}
	for _, p := range req.prompts {
		if req.model.Server == SGLang {
			if p >= limit {
				return &requestError{status: http.StatusBadRequest, inEngine: true,
					message: fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", p, limit)}
			}
			if req.maxTokens >= 0 && p+req.maxTokens >= limit {
				return &requestError{status: http.StatusBadRequest, inEngine: true,
					message: fmt.Sprintf("Requested token count exceeds the model's maximum context length of %d tokens. You requested a total of %d tokens: %d tokens from the input messages and %d tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.", limit, p+req.maxTokens, p, req.maxTokens)}
			}
			continue
		}
		if p > limit {
			return badRequest("Input length (%d) exceeds model's maximum context length (%d).", p, limit)
		}
		if req.maxTokens >= 0 && p+req.maxTokens > limit {
			return &requestError{status: http.StatusBadRequest, param: "max_tokens", value: strconv.Itoa(req.maxTokens),
				message: fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).", req.maxTokens, limit, p, req.maxTokens, limit, p)}
		}
		if req.maxTokens < 0 && p == limit {
			return badRequest("max_tokens must be at least 1, got 0.")
		}
	}
	return nil
}

// room is how many tokens fit after the longest prompt; -1 without a context length.
func (req *request) room() int {
	if req.model.ContextLength <= 0 {
		return -1
	}
	longest := 0
	for _, p := range req.prompts {
		longest = max(longest, p)
	}
	return max(0, req.model.ContextLength-longest)
}

// checkEngine is what vLLM's engine validates once a request is scheduled
// (SamplingParams._validate_logprobs): more logprobs than --max-logprobs.
func (req *request) checkEngine() *requestError {
	if req.model.Server == VLLM && req.logprobs > maxLogprobs {
		return &requestError{status: http.StatusBadRequest, param: "logprobs", value: strconv.Itoa(req.logprobs), inEngine: true,
			message: fmt.Sprintf("Requested sample logprobs of %d, which is greater than max allowed: %d", req.logprobs, maxLogprobs)}
	}
	return nil
}
