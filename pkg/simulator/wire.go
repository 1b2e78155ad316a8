package simulator

// The response bodies, in vLLM's field order. They follow OpenAI's schemas
// (CreateChatCompletionResponse, CreateChatCompletionStreamResponse, CreateCompletionResponse):
// a chat message always carries content and refusal, a choice always carries logprobs, as null.

// completion is a response or stream chunk of either endpoint, by its choices: chatChoice
// ("chat.completion", "chat.completion.chunk") or textChoice ("text_completion" for both).
type completion[C any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// chatChoice carries Message in a response and Delta in a chunk.
type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatDelta   `json:"delta,omitempty"`
	Logprobs     *struct{}    `json:"logprobs"`      // always null
	FinishReason *string      `json:"finish_reason"` // null in chunks before the last
}

type chatMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"` // null for a tool call
	Refusal          *string    `json:"refusal"` // always null
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
	Reasoning        *string    `json:"reasoning,omitempty"`         // vLLM
	ReasoningContent *string    `json:"reasoning_content,omitempty"` // SGLang
}

type chatDelta struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	Reasoning        *string    `json:"reasoning,omitempty"`         // vLLM
	ReasoningContent *string    `json:"reasoning_content,omitempty"` // SGLang
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// toolCall is a tool call in a message, or a fragment of one in a delta (with Index).
type toolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`      // always null
	FinishReason *string   `json:"finish_reason"` // null in chunks before the last
}

type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// sglangChunk is one of SGLang's chunks, as pydantic's model_dump_json writes them: every field,
// null when unset (python/sglang/srt/entrypoints/openai/serving_chat.py, protocol.py).
type sglangChunk[C, U any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   *U     `json:"usage"`
}

// sglangUsage is SGLang's UsageInfo with its null details: "prompt_tokens_details": null when
// no cached tokens are reported.
type sglangUsage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

type sglangChatChoice struct {
	Index        int         `json:"index"`
	Delta        sglangDelta `json:"delta"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason *string     `json:"finish_reason"`
	MatchedStop  *string     `json:"matched_stop"`
}

type sglangDelta struct {
	Role             *string    `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent *string    `json:"reasoning_content"`
	ToolCalls        []toolCall `json:"tool_calls"`
}

// sglangTextChoice is textChoice with "matched_stop": null after its fields.
type sglangTextChoice struct {
	textChoice
	MatchedStop *string `json:"matched_stop"`
}
