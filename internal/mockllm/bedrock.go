package mockllm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/oncegate/oncegate/internal/openaiwire"
)

// serveBedrock speaks Amazon Bedrock's Converse API on top of the chat mock:
//
//	POST /model/{model id}/converse
//	POST /model/{model id}/converse-stream
//
// Every request must carry a SigV4 Authorization (AWS4-HMAC-SHA256, service bedrock) and
// X-Amz-Date, else 403 as Bedrock answers; with Options.AWSSecretKey the signature itself is
// checked (recomputed over the signed headers and the body with the SDK's signer). The
// Converse request becomes the equivalent chat request (system blocks as a system message,
// each message's text blocks joined, inferenceConfig.maxTokens as max_tokens), so the same
// deterministic tokens, knobs (X-Mock-* headers only) and faults apply. The answer is a
// Converse response, or AWS's binary event stream (application/vnd.amazon.eventstream,
// encoded by the SDK's encoder): messageStart, contentBlockStart, a contentBlockDelta per
// token, contentBlockStop, messageStop with the stopReason, metadata with the usage. An
// in-stream error fault is a modelStreamErrorException message, then the end; an error is
// Bedrock's {"__type", "message"} with X-Amzn-ErrorType.
func (s *Server) serveBedrock(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/model/")
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		writeBedrockError(w, http.StatusNotFound, "mock: unknown operation")
		return
	}
	model, op := rest[:i], rest[i+1:]
	stream := op == "converse-stream"
	if op != "converse" && !stream {
		writeBedrockError(w, http.StatusNotFound, "mock: unknown operation "+op)
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		writeBedrockError(w, http.StatusBadRequest, "could not read the request body")
		return
	}
	if status, msg := s.checkSigV4(r, body); status != 0 {
		writeBedrockError(w, status, msg)
		return
	}
	var req struct {
		Messages []struct {
			Role    string     `json:"role"`
			Content []textPart `json:"content"`
		} `json:"messages"`
		System          []textPart `json:"system"`
		InferenceConfig struct {
			MaxTokens *int64 `json:"maxTokens"`
		} `json:"inferenceConfig"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeBedrockError(w, http.StatusBadRequest, "Malformed input request, please reformat your input and try again.")
		return
	}
	if len(req.Messages) == 0 {
		writeBedrockError(w, http.StatusBadRequest, "A conversation must start with a user message. Try again with a conversation that starts with a user message.")
		return
	}
	var msgs []map[string]string
	if len(req.System) > 0 {
		msgs = append(msgs, map[string]string{"role": "system", "content": joinText(req.System)})
	}
	for _, m := range req.Messages {
		msgs = append(msgs, map[string]string{"role": m.Role, "content": joinText(m.Content)})
	}
	resp, c, ok := s.chatVia(w, r, model, msgs, req.InferenceConfig.MaxTokens, stream, writeBedrockError)
	switch {
	case !ok:
		return
	case c != nil:
		writeJSON(w, http.StatusOK, map[string]any{
			"output":     map[string]any{"message": map[string]any{"role": "assistant", "content": []any{map[string]string{"text": c.Choices[0].Message.Content}}}},
			"stopReason": bedrockStop(c.Choices[0].FinishReason), "usage": bedrockUsage(c.Usage), "metrics": map[string]int{"latencyMs": 1}})
		return
	}
	defer resp.Body.Close()
	bedrockStream(w, resp.Body)
}

// checkSigV4 is 0 for a request signed as Bedrock wants it, else the status and message
// Bedrock answers.
func (s *Server) checkSigV4(r *http.Request, body []byte) (int, string) {
	auth := r.Header.Get("Authorization")
	fields, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	date, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if !ok || err != nil {
		return http.StatusForbidden, "Missing Authentication Token"
	}
	var scope, signed []string
	for _, f := range strings.Split(fields, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
		switch k {
		case "Credential":
			scope = strings.Split(v, "/")
		case "SignedHeaders":
			signed = strings.Split(v, ";")
		}
	}
	if len(scope) != 5 || scope[3] != "bedrock" || scope[4] != "aws4_request" {
		return http.StatusForbidden, "Credential should be scoped to correct service: 'bedrock'."
	}
	if s.opts.AWSSecretKey == "" {
		return 0, ""
	}
	again, err := http.NewRequest(http.MethodPost, "http://"+r.Host+r.URL.EscapedPath(), nil) // #nosec G704 -- never sent: a copy of the request the mock received, to recompute its signature
	if err != nil {
		return http.StatusForbidden, err.Error()
	}
	for _, h := range signed {
		switch h {
		case "host":
		case "content-length": // the signer signs the field, not a header
			again.ContentLength = r.ContentLength
		default:
			again.Header.Set(h, r.Header.Get(h))
		}
	}
	again.Header.Del("Authorization")
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: scope[0], SecretAccessKey: s.opts.AWSSecretKey, SessionToken: r.Header.Get("X-Amz-Security-Token")}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), scope[3], scope[2], date); err != nil {
		return http.StatusForbidden, err.Error()
	}
	if again.Header.Get("Authorization") != auth {
		return http.StatusForbidden, "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method."
	}
	return 0, ""
}

func bedrockUsage(u usage) map[string]int {
	return map[string]int{"inputTokens": u.PromptTokens, "outputTokens": u.CompletionTokens, "totalTokens": u.TotalTokens}
}

func bedrockStop(finish string) string {
	if finish == "length" {
		return "max_tokens"
	}
	return "end_turn"
}

// bedrockStream translates the chat mock's stream into ConverseStream's event stream.
func bedrockStream(w http.ResponseWriter, body io.Reader) {
	w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
	w.WriteHeader(http.StatusOK)
	enc := eventstream.NewEncoder()
	send := func(msg eventstream.Message) {
		if err := enc.Encode(w, msg); err != nil || flush(w) != nil {
			panic(http.ErrAbortHandler)
		}
	}
	event := func(name string, v any) {
		msg := eventstream.Message{Payload: marshal(v)}
		msg.Headers.Set(":message-type", eventstream.StringValue("event"))
		msg.Headers.Set(":event-type", eventstream.StringValue(name))
		msg.Headers.Set(":content-type", eventstream.StringValue("application/json"))
		send(msg)
	}
	event("messageStart", map[string]string{"role": "assistant"})
	event("contentBlockStart", map[string]any{"contentBlockIndex": 0, "start": map[string]any{}})
	er := openaiwire.NewEventReader(body)
	finish := ""
	for {
		data, err := er.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler) // the inner stream broke: so does this one
		}
		if isInStreamError(data) {
			msg := eventstream.Message{Payload: marshal(map[string]string{"message": "mock in-stream error"})}
			msg.Headers.Set(":message-type", eventstream.StringValue("exception"))
			msg.Headers.Set(":exception-type", eventstream.StringValue("modelStreamErrorException"))
			msg.Headers.Set(":content-type", eventstream.StringValue("application/json"))
			send(msg)
			return
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			panic(http.ErrAbortHandler)
		}
		if len(c.Choices) == 0 { // the usage chunk ends the answer
			var u usage
			_ = json.Unmarshal(c.Usage, &u)
			event("contentBlockStop", map[string]int{"contentBlockIndex": 0})
			event("messageStop", map[string]string{"stopReason": bedrockStop(finish)})
			event("metadata", map[string]any{"usage": bedrockUsage(u), "metrics": map[string]int{"latencyMs": 1}})
			continue
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			event("contentBlockDelta", map[string]any{"contentBlockIndex": 0, "delta": map[string]string{"text": *ch.Delta.Content}})
		}
	}
}

// bedrockErrorType is the exception Bedrock names for an HTTP status.
func bedrockErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "ValidationException"
	case http.StatusUnauthorized, http.StatusForbidden:
		return "AccessDeniedException"
	case http.StatusNotFound:
		return "ResourceNotFoundException"
	case http.StatusRequestTimeout:
		return "ModelTimeoutException"
	case http.StatusTooManyRequests:
		return "ThrottlingException"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableException"
	}
	return "InternalServerException"
}

func writeBedrockError(w http.ResponseWriter, status int, msg string) {
	typ := bedrockErrorType(status)
	w.Header().Set("X-Amzn-ErrorType", typ+":http://internal.amazon.com/coral/com.amazon.bedrock/")
	writeJSON(w, status, map[string]string{"__type": typ, "message": msg})
}
