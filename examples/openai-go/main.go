// Command openai-go calls oncegate with the official OpenAI Go SDK, unchanged: the code the
// README shows. e2e/readme_test.go checks that the README's snippet is the code between the
// README markers below, and runs this program against a started gateway.
//
//	go run ./examples/openai-go [BASE_URL]   # default http://127.0.0.1:8080/v1
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func main() {
	baseURL := "http://127.0.0.1:8080/v1"
	if len(os.Args) > 1 {
		baseURL = os.Args[1]
	}
	ctx := context.Background()

	// README:begin
	client := openai.NewClient(
		option.WithBaseURL(baseURL), // http://127.0.0.1:8080/v1
		option.WithAPIKey("unused-without-tenants"),
	)
	var resp *http.Response
	r, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "oncegate-mock",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	},
		option.WithHeader("Idempotency-Key", "order-42-summary"), // per call, never client-wide
		option.WithResponseInto(&resp),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(resp.Header.Get("Oncegate-Idempotency"), resp.Header.Get("Oncegate-Job-Id"))
	fmt.Println(r.Choices[0].Message.Content)
	// README:end
}
