package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/neocloud/kiln/pkg/catalog"
)

// catalogDocs answers "kilnctl catalog docs": it renders the customers' Models page from a
// catalog file, so that the page cannot drift from what the gateway serves.
func catalogDocs(ctx context.Context, c *cli, f *flags, args []string) error {
	lang := f.String("lang", "", "the page's `LANGUAGE`: en, ja or ko (required)")
	file := f.String("catalog", "", "the catalog `FILE` (default: the reference catalog, infra/catalog.yaml)")
	out := f.String("out", "", "write the page to `FILE` instead of stdout")
	if _, err := f.parse(args); err != nil {
		return err
	}
	words, ok := modelsPageWords[*lang]
	if !ok {
		return f.usageErr("--lang %q: want one of en, ja, ko", *lang)
	}
	var (
		cat *catalog.Catalog
		err error
	)
	if *file == "" {
		cat, err = catalog.Parse(catalog.ReferenceYAML())
	} else {
		cat, err = catalog.Load(*file)
	}
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	page, err := modelsPage(cat, words)
	if err != nil {
		return err
	}
	if *out == "" {
		if *f.json {
			return writeJSON(c.stdout, struct {
				Lang string `json:"lang"`
				Page string `json:"page"` // the Markdown
			}{*lang, string(page)})
		}
		_, err = c.stdout.Write(page)
		return err
	}
	// Write the whole page or leave the old one: a half-written page is worse than none.
	tmp := *out + ".tmp"
	if err := os.WriteFile(tmp, page, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", *out, err)
	}
	if *f.json {
		return writeJSON(c.stdout, struct {
			Lang string `json:"lang"`
			Out  string `json:"out"`
		}{*lang, *out})
	}
	return nil
}

// pageWords are the words of one language's Models page. Product names, model ids, parameter
// names and codes stay untranslated.
type pageWords struct {
	title, intro                                          string
	colModel, colContext, colInput, colParallel, colForce string
	colIgnoreEOS, colPriceIn, colPriceCached, colPriceOut string
	yes, no                                               string
	modalities                                            map[string]string
	columnsTitle                                          string
	columns                                               []string // one explanation per column, in order
	exampleTitle, example                                 string   // example: model id, prompt, cached, completion, cost
}

var modelsPageWords = map[string]pageWords{
	"en": {
		title: "Models",
		intro: "The models the gateway serves today, with what each one accepts and what it costs. " +
			"The list is the one GET /v1/models returns, in the same order. Use the Model value as `model` in a request.",
		colModel: "Model", colContext: "Context length", colInput: "Input",
		colParallel: "Parallel tool calls", colForce: "Forced tool choice", colIgnoreEOS: "ignore_eos",
		colPriceIn: "Input", colPriceCached: "Cached input", colPriceOut: "Output",
		yes: "yes", no: "no",
		modalities:   map[string]string{"text": "text", "image": "image", "audio": "audio"},
		columnsTitle: "What the columns mean",
		columns: []string{
			"Context length: the model's context window in tokens, prompt and completion together. A longer request is rejected with 400 by the model server. A request without max_tokens reserves credits for a completion as long as the context leaves (see the [API Reference](api-reference.md) page).",
			"Input: what a message may contain. Image parts (image_url) work only on models whose input includes image.",
			"Parallel tool calls: yes when the model honours parallel_tool_calls. On a model marked no the setting is not applied, and one reply can still carry several tool calls.",
			"Forced tool choice: no means tool_choice \"required\" or a named function is rejected with 400 (unsupported_parameter) before the request reaches the model. Send tool_choice \"auto\".",
			"ignore_eos: no means ignore_eos: true on POST /v1/chat/completions is rejected with 400 (unsupported_parameter). POST /v1/completions always forwards it.",
			"Prices are USD per 1M tokens, exact decimals. Input is for prompt tokens not served from the prefix cache, Cached input for prompt tokens that were (usage.prompt_tokens_details.cached_tokens), Output for completion tokens, reasoning tokens included.",
			"The cost of a request is (prompt − cached) × Input + cached × Cached input + completion × Output, computed exactly and returned as usage.cost.",
		},
		exampleTitle: "Example",
		example:      "On %s, a request with %s prompt tokens (%s of them cached) and %s completion tokens costs %s USD.",
	},
	"ja": {
		title: "モデル",
		intro: "現在ゲートウェイが提供しているモデルと、各モデルが受け付ける入力、料金の一覧です。" +
			"一覧は GET /v1/models が返すものと同じで、順序も同じです。リクエストの `model` には「モデル」列の値を指定してください。",
		colModel: "モデル", colContext: "コンテキスト長", colInput: "入力",
		colParallel: "並列ツール呼び出し", colForce: "強制的なツール選択", colIgnoreEOS: "ignore_eos",
		colPriceIn: "入力", colPriceCached: "キャッシュ済み入力", colPriceOut: "出力",
		yes: "対応", no: "非対応",
		modalities:   map[string]string{"text": "テキスト", "image": "画像", "audio": "音声"},
		columnsTitle: "各列の意味",
		columns: []string{
			"コンテキスト長: モデルのコンテキストウィンドウのトークン数で、プロンプトと生成の合計です。これを超えるリクエストはモデルサーバーが 400 で拒否します。max_tokens を指定しないリクエストは、コンテキストに収まる最大の生成長の分だけクレジットを予約します（[API リファレンス](api-reference.md)ページを参照）。",
			"入力: メッセージに含められる内容です。画像パート（image_url）は、入力に画像を含むモデルでのみ動作します。",
			"並列ツール呼び出し: 対応のモデルは parallel_tool_calls に従います。非対応のモデルでは設定が適用されず、1 つの応答に複数のツール呼び出しが含まれることがあります。",
			"強制的なツール選択: 非対応のモデルでは、tool_choice の \"required\" や関数名の指定は、モデルに届く前に 400（unsupported_parameter）で拒否されます。tool_choice は \"auto\" を送ってください。",
			"ignore_eos: 非対応のモデルでは、POST /v1/chat/completions の ignore_eos: true は 400（unsupported_parameter）で拒否されます。POST /v1/completions では常にそのまま転送されます。",
			"料金は 100 万トークンあたりの USD で、正確な 10 進数です。「入力」はプレフィックスキャッシュを使わなかったプロンプトトークン、「キャッシュ済み入力」はキャッシュから提供されたプロンプトトークン（usage.prompt_tokens_details.cached_tokens）、「出力」は reasoning トークンを含む生成トークンの料金です。",
			"リクエストの料金は (プロンプト − キャッシュ済み) × 入力 + キャッシュ済み × キャッシュ済み入力 + 生成 × 出力 で、端数を丸めずに計算され、usage.cost として返されます。",
		},
		exampleTitle: "例",
		example:      "%s で、プロンプト %s トークン（うちキャッシュ済み %s）、生成 %s トークンのリクエストの料金は %s USD です。",
	},
	"ko": {
		title: "모델",
		intro: "현재 게이트웨이가 제공하는 모델과, 모델마다 받는 입력과 가격입니다. " +
			"목록은 GET /v1/models가 반환하는 것과 같고 순서도 같습니다. 요청의 `model`에는 '모델' 열의 값을 사용하세요.",
		colModel: "모델", colContext: "컨텍스트 길이", colInput: "입력",
		colParallel: "병렬 툴 호출", colForce: "강제 툴 선택", colIgnoreEOS: "ignore_eos",
		colPriceIn: "입력", colPriceCached: "캐시된 입력", colPriceOut: "출력",
		yes: "지원", no: "미지원",
		modalities:   map[string]string{"text": "텍스트", "image": "이미지", "audio": "오디오"},
		columnsTitle: "열의 의미",
		columns: []string{
			"컨텍스트 길이: 모델의 컨텍스트 윈도 크기(토큰)로, 프롬프트와 생성 결과를 합친 값입니다. 이보다 긴 요청은 모델 서버가 400으로 거부합니다. max_tokens가 없는 요청은 컨텍스트에 남는 최대 길이만큼의 생성분 크레딧을 예약합니다([API 레퍼런스](api-reference.md) 페이지 참고).",
			"입력: 메시지에 담을 수 있는 내용입니다. 이미지 파트(image_url)는 입력에 이미지가 포함된 모델에서만 동작합니다.",
			"병렬 툴 호출: 지원 모델은 parallel_tool_calls 설정을 따릅니다. 미지원 모델에서는 설정이 적용되지 않으며, 응답 하나에 툴 호출이 여러 개 담길 수 있습니다.",
			"강제 툴 선택: 미지원 모델에서는 tool_choice \"required\"나 함수 이름 지정이 모델에 닿기 전에 400(unsupported_parameter)으로 거부됩니다. tool_choice는 \"auto\"를 보내세요.",
			"ignore_eos: 미지원 모델에서는 POST /v1/chat/completions의 ignore_eos: true가 400(unsupported_parameter)으로 거부됩니다. POST /v1/completions는 항상 그대로 전달합니다.",
			"가격은 100만 토큰당 USD이며 정확한 10진수입니다. '입력'은 프리픽스 캐시를 쓰지 않은 프롬프트 토큰, '캐시된 입력'은 캐시에서 제공된 프롬프트 토큰(usage.prompt_tokens_details.cached_tokens), '출력'은 reasoning 토큰을 포함한 생성 토큰의 가격입니다.",
			"요청 비용은 (프롬프트 − 캐시됨) × 입력 + 캐시됨 × 캐시된 입력 + 생성 × 출력으로, 반올림 없이 계산되어 usage.cost로 반환됩니다.",
		},
		exampleTitle: "예시",
		example:      "%s에서 프롬프트 %s 토큰(그중 캐시됨 %s), 생성 %s 토큰인 요청의 비용은 %s USD입니다.",
	},
}

// modelsPage renders the Models page of cat in one language. The same catalog and words always
// give the same bytes, which is what the drift test relies on.
func modelsPage(cat *catalog.Catalog, w pageWords) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("<!-- Generated by `kilnctl catalog docs` from the model catalog. Do not edit: run `make customer-docs`. -->\n\n")
	fmt.Fprintf(&b, "# %s\n\n%s\n\n", w.title, w.intro)
	fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s (USD / 1M) | %s (USD / 1M) | %s (USD / 1M) |\n",
		w.colModel, w.colContext, w.colInput, w.colParallel, w.colForce, w.colIgnoreEOS,
		w.colPriceIn, w.colPriceCached, w.colPriceOut)
	b.WriteString("|---|--:|---|---|---|---|--:|--:|--:|\n")
	for _, m := range cat.Models {
		mods := make([]string, len(m.InputModalities))
		for i, mod := range m.InputModalities {
			name, ok := w.modalities[mod]
			if !ok {
				return nil, fmt.Errorf("model %s: input modality %q has no name on the page", m.ID, mod)
			}
			mods[i] = name
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			m.ID, thousands(int64(m.ContextLength)), strings.Join(mods, ", "),
			w.yesNo(m.ParallelToolCalls), w.yesNo(m.ForcedToolChoice), w.yesNo(m.IgnoreEOS),
			usd(m.Pricing.Input), usd(m.Pricing.CachedInput), usd(m.Pricing.Output))
	}
	fmt.Fprintf(&b, "\n## %s\n\n", w.columnsTitle)
	for _, c := range w.columns {
		fmt.Fprintf(&b, "- %s\n", c)
	}
	if len(cat.Models) > 0 {
		// The example is computed with the gateway's own cost function, not written by hand.
		m := cat.Models[len(cat.Models)-1]
		const prompt, cached, completion = 1000, 200, 500
		cost, err := m.Pricing.Cost(prompt, cached, completion)
		if err != nil {
			return nil, fmt.Errorf("model %s: example cost: %w", m.ID, err)
		}
		fmt.Fprintf(&b, "\n## %s\n\n", w.exampleTitle)
		fmt.Fprintf(&b, w.example+"\n", "`"+m.ID+"`", thousands(prompt), thousands(cached), thousands(completion), cost.String())
	}
	return b.Bytes(), nil
}

// thousands writes n with a comma between groups of three digits, as the pages write counts:
// 131,072.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func (w pageWords) yesNo(v bool) string {
	if v {
		return w.yes
	}
	return w.no
}
