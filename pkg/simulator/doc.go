// Package simulator is a deterministic model server that speaks the OpenAI-compatible HTTP
// protocol of today's vLLM or, per model, of SGLang. The gateway's demo (make run), its tests and
// its benchmarks use it in place of a GPU. What each server does was read from its source; the
// files and commits are listed at VLLM and SGLang.
//
// It serves POST /v1/chat/completions, POST /v1/completions, GET /v1/models and GET /health.
// Any other path answers 404 with the server's error body: vLLM's nested one (since v0.10.1),
//
//	{"error":{"message":"...","type":"NotFoundError","param":null,"code":404}}
//
// or SGLang's flat {"object":"error","message":"...","type":"...","param":null,"code":404}.
//
// # What it generates
//
// The prompt is counted as one token per whitespace-separated word: over the text of every
// message for chat (string contents and the "text" of content parts), over the prompt for
// completions. An array of strings, or of token-id lists, is several prompts, each answered by
// its own n choices, as both servers do; a list of token ids counts its ids.
//
// Each choice's answer is max_tokens tokens (max_completion_tokens is read too), finish reason
// "length". Without max_tokens the model stops of its own accord after 16 tokens ("stop"), or
// earlier with "length" when the context leaves less room (vLLM lowers a missing max_tokens to
// fit). Token i is "tok<i>", with a leading space after the first: "tok0 tok1 tok2 ...".
//
// Streaming answers (stream: true) send one event per token and choice and end with
// "data: [DONE]". vLLM puts the last token and the finish reason in one chunk, as SGLang does on
// completions; SGLang's chat stream sends the finish reason in a chunk of its own (its chunks,
// written by pydantic, carry every field, null when unset: "usage": null).
// stream_options.include_usage adds the final usage chunk: every prompt once, every choice's
// completion tokens. With continuous_usage_stats vLLM (both endpoints) and SGLang (chat only)
// put a running usage on each chunk that counts the chunk's own choice only, against its own
// prompt, and never cached tokens.
//
// Cached prompt tokens are reported only when the model's CachedTokens is set (vLLM's
// --enable-prompt-tokens-details, SGLang's --enable-cache-report): by vLLM always, zero included,
// by SGLang only when there are some; never per chunk. Reasoning goes in "reasoning" (vLLM) or
// "reasoning_content" (SGLang), in messages and in deltas. Ids are deterministic: "chatcmpl-" or
// "cmpl-" and the request's sequence number in 32 hex digits, and "call_" with 24 for tool calls.
//
// # Errors, where each server raises them
//
// Invalid JSON, a wrong field type, a missing model, messages or prompt, max_tokens below 1, n
// outside 1..128, stream that is not a JSON boolean, or stream_options without stream: true are
// 400; an unknown model is 404 "The model `X` does not exist.".
//
// vLLM checks the context before anything is streamed: a prompt longer than the context is
// "Input length (P) exceeds model's maximum context length (C).", a max_tokens that does not fit
// beside the prompt "'max_tokens' or 'max_completion_tokens' is too large: M. This model's
// maximum context length is C tokens and your request has P input tokens (M > C - P)." with
// param "max_tokens". Its engine validates sampling parameters only once generation starts: more
// than 20 logprobs (top_logprobs on chat, logprobs on completions) is, on a streaming request, a
// 200 stream whose only event is {"error": {"message": "Requested sample logprobs of N, which is
// greater than max allowed: 20", "type": "BadRequestError", "param": "logprobs", "code": 400}}
// and then [DONE] (the event written by Python's json.dumps, with spaces), a 400 otherwise.
//
// vLLM's request models also check some things in pydantic validators of the whole request:
// top_logprobs without logprobs: true on chat is a 400 whose message is pydantic's list of
// errors, repeating the body as received ('input': {...}), as vLLM answers such checks.
//
// SGLang checks the context in its tokenizer manager, once the stream has started: "The input
// (P tokens) is longer than the model's context length (C tokens)." when P reaches the context,
// "Requested token count exceeds the model's maximum context length of C tokens. ..." when
// P + max_tokens does; as the only event of a 200 stream when streaming.
//
// A model configured with RejectRequiredToolChoice answers tool_choice "required" with a
// plain-text 500, as qwen3-32b on vLLM does. Unknown fields are ignored.
//
// # Directives
//
// Put directives in the last user message (chat) or in the prompt (completions; for an array of
// strings, in its last element) to choose what the simulator does. A directive is written
// [[sim:NAME=VALUE]], with no spaces, and counts as one prompt token like any other word:
//
//	[[sim:tokens=N]]         stop after N tokens with finish_reason "stop" (when N is below
//	                         max_tokens; otherwise the answer is max_tokens long, "length").
//	[[sim:delay_ms=N]]       wait N ms before each streamed token; a non-streaming answer waits
//	                         tokens × N ms in total.
//	[[sim:first_byte_ms=N]]  wait N ms before sending the response headers, whatever the response.
//	[[sim:status=N]]         answer with HTTP status N (400–599) instead: 501 and any 4xx as the
//	                         server's error JSON with that code, any other 5xx as the plain
//	                         status text ("Internal Server Error").
//	[[sim:stream_error=N]]   streaming: answer 200, send the tokens the tokens directive asks for
//	                         (none by default, and then not even the role chunk), then the
//	                         server's error event with code N and [DONE]; non-streaming: the
//	                         error JSON with status N.
//	[[sim:drop_after=N]]     streaming: cut the connection abruptly after N token chunks (no final
//	                         chunk, no [DONE]), even when the answer is shorter; non-streaming: cut
//	                         it before any byte of the response.
//	[[sim:tool_call=NAME]]   chat only: call function NAME with {"city": "Paris", "unit": "celsius"},
//	                         finish_reason "tool_calls", content null. Streamed, the first tool
//	                         chunk carries the id, type and name, the next ones 5-byte pieces of the
//	                         arguments; each piece is one completion token. max_tokens and tokens
//	                         do not shorten a tool call. A request whose last message is a tool
//	                         result (role "tool") is answered with text, as after a real call.
//	[[sim:reasoning=N]]      chat only: the first N tokens of the answer are reasoning,
//	                         "think0 think1 ...", in the server's reasoning field.
//	[[sim:cached=N]]         report prompt_tokens_details.cached_tokens = min(N, prompt tokens),
//	                         where the server reports cached tokens at all.
//
// Directives combine; when one is repeated, the last wins. An unknown name, a malformed
// directive or a bad value is refused with 400. Example:
//
//	curl localhost:8000/v1/chat/completions -d '{"model":"Qwen/Qwen3-32B","stream":true,
//	  "messages":[{"role":"user","content":"hi [[sim:tokens=3]] [[sim:delay_ms=200]]"}]}'
package simulator
