// Package simulator is a deterministic model server that speaks vLLM's OpenAI-compatible HTTP
// protocol. The gateway's demo (make run), its tests and its benchmarks use it in place of a GPU.
//
// It serves POST /v1/chat/completions, POST /v1/completions, GET /v1/models and GET /health.
// Any other path answers 404 with vLLM's error body:
//
//	{"object":"error","message":"...","type":"NotFoundError","param":null,"code":404}
//
// # What it generates
//
// The prompt is counted as one token per whitespace-separated word: over the text of every
// message for chat (string contents and the "text" of content parts), over the prompt for
// completions (an array of strings is summed, an array of token ids counts its ids).
//
// The answer is max_tokens tokens (max_completion_tokens is read too; the default is 16). Token i
// is "tok<i>", with a leading space after the first: "tok0 tok1 tok2 ...", and the finish reason is
// "length". A request whose prompt plus max_tokens exceeds the model's context length is refused
// with 400 and vLLM's message. Streaming answers (stream: true) send one event per token and end
// with "data: [DONE]"; stream_options.include_usage adds the usage chunk, and
// continuous_usage_stats puts the running usage on every chunk, as vLLM does. Ids are
// deterministic: "chatcmpl-" or "cmpl-" and the request's sequence number in 32 hex digits, and
// "call_" with 24 for tool calls.
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
//	[[sim:status=N]]         answer with HTTP status N (400–599) instead: 500 is a text/plain
//	                         "Internal Server Error", any other 5xx the plain status text, a 4xx
//	                         vLLM's error JSON with that code.
//	[[sim:drop_after=N]]     streaming: cut the connection abruptly after N token chunks (no final
//	                         chunk, no [DONE]), even when the answer is shorter; non-streaming: cut
//	                         it before any byte of the response.
//	[[sim:tool_call=NAME]]   chat only: call function NAME with {"city": "Paris", "unit": "celsius"},
//	                         finish_reason "tool_calls", content null. Streamed, the first tool
//	                         chunk carries the id, type and name, the next ones 5-byte pieces of the
//	                         arguments; each piece is one completion token. max_tokens and tokens
//	                         do not shorten a tool call.
//	[[sim:cached=N]]         report usage.prompt_tokens_details.cached_tokens = min(N, prompt tokens).
//
// Directives combine; when one is repeated, the last wins. An unknown name, a malformed
// directive or a bad value is refused with 400. Example:
//
//	curl localhost:8000/v1/chat/completions -d '{"model":"Qwen/Qwen3-32B","stream":true,
//	  "messages":[{"role":"user","content":"hi [[sim:tokens=3]] [[sim:delay_ms=200]]"}]}'
//
// # Like vLLM
//
// Errors are vLLM's flat JSON body with type BadRequestError (400), NotFoundError (404) and so on.
// Invalid JSON, a wrong field type, a missing model, messages or prompt, max_tokens below 1,
// stream that is not a JSON boolean, or stream_options without stream: true are 400; an unknown
// model is 404 "The model `X` does not exist.". A model configured with RejectRequiredToolChoice
// answers tool_choice "required" with a plain-text 500, as qwen3-32b on vLLM does. n other than 1
// is refused with 400: the simulator generates a single choice. Unknown fields are ignored.
package simulator
