package mockllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/oncegate/oncegate/internal/openaiwire"
)

// serveGemini speaks Google's Gemini API on top of the chat mock:
//
//	POST /v1beta/models/{model}:generateContent
//	POST /v1beta/models/{model}:streamGenerateContent?alt=sse
//
// The GenerateContentRequest becomes the equivalent chat request (systemInstruction as a
// system message, role "model" as "assistant", generationConfig.maxOutputTokens as
// max_tokens), so the same deterministic tokens, knobs (X-Mock-* headers only: Gemini has no
// room for a "mock" member) and faults apply; the answer is a GenerateContentResponse, or SSE
// events each carrying one (CRLF-terminated, no [DONE], the last with finishReason and the
// whole usageMetadata); an error is Google's {"error": {"code", "message", "status"}}.
func (s *Server) serveGemini(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/v1beta/models/")
	model, method, ok := strings.Cut(rest, ":")
	stream := method == "streamGenerateContent"
	switch {
	case !ok || (method != "generateContent" && !stream):
		writeGeminiError(w, http.StatusNotFound, "mock: unknown method "+method)
		return
	case stream && r.URL.Query().Get("alt") != "sse":
		writeGeminiError(w, http.StatusBadRequest, "mock: streamGenerateContent is served with alt=sse only")
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		writeGeminiError(w, http.StatusBadRequest, "could not read the request body")
		return
	}
	var req struct {
		Contents []struct {
			Role  string     `json:"role"`
			Parts []textPart `json:"parts"`
		} `json:"contents"`
		SystemInstruction *struct {
			Parts []textPart `json:"parts"`
		} `json:"systemInstruction"`
		GenerationConfig struct {
			MaxOutputTokens *int64 `json:"maxOutputTokens"`
		} `json:"generationConfig"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeGeminiError(w, http.StatusBadRequest, "Invalid JSON payload received.")
		return
	}
	if len(req.Contents) == 0 {
		writeGeminiError(w, http.StatusBadRequest, "* GenerateContentRequest.contents: contents is not specified")
		return
	}
	var msgs []map[string]string
	if si := req.SystemInstruction; si != nil {
		msgs = append(msgs, map[string]string{"role": "system", "content": joinText(si.Parts)})
	}
	for _, c := range req.Contents {
		role := "user"
		if c.Role == "model" {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": joinText(c.Parts)})
	}
	resp, c, ok := s.chatVia(w, r, model, msgs, req.GenerationConfig.MaxOutputTokens, stream, writeGeminiError)
	switch {
	case !ok:
		return
	case c != nil:
		writeJSON(w, http.StatusOK, geminiResponse(c.ID, c.Model, c.Choices[0].Message.Content, c.Choices[0].FinishReason, &c.Usage))
		return
	}
	defer resp.Body.Close()
	s.geminiStream(w, resp.Body)
}

// textPart is a text part (Gemini) or block (Bedrock) of a request.
type textPart struct {
	Text string `json:"text"`
}

// joinText is the text of parts, joined.
func joinText(parts []textPart) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// chatVia runs the chat request of msgs (max_tokens when maxTokens is set) for a route that
// speaks another API: ok is false when the chat mock refused it (written with writeErr). A
// non-stream request's answer is its completion c; a stream's is the live response (whose
// body the caller closes), with the usage chunk asked for.
func (s *Server) chatVia(w http.ResponseWriter, r *http.Request, model string, msgs []map[string]string, maxTokens *int64, stream bool,
	writeErr func(http.ResponseWriter, int, string)) (resp *http.Response, c *completion, ok bool) {
	chat := map[string]any{"model": model, "messages": msgs, "stream": stream}
	if maxTokens != nil {
		chat["max_tokens"] = *maxTokens
	}
	if stream {
		chat["stream_options"] = map[string]bool{"include_usage": true}
	}
	resp, ok = s.inner(w, r, chat, writeErr)
	if !ok || stream {
		return resp, nil, ok
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	c = &completion{}
	if err := json.Unmarshal(b, c); err != nil || len(c.Choices) == 0 {
		writeErr(w, http.StatusInternalServerError, "mock: inner answer unreadable")
		return nil, nil, false
	}
	return nil, c, true
}

// inner runs chat on the chat mock with the request's X-Mock-* headers; a refusal is written
// with writeErr (status, message) and ok is false.
func (s *Server) inner(w http.ResponseWriter, r *http.Request, chat map[string]any, writeErr func(http.ResponseWriter, int, string)) (*http.Response, bool) {
	inner, _ := json.Marshal(chat)
	ireq, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://mock.internal/v1/chat/completions", bytes.NewReader(inner))
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return nil, false
	}
	for _, h := range []string{"X-Mock-TTFT-Ms", "X-Mock-Inter-Token-Ms", "X-Mock-Tokens", "X-Mock-Fault", "X-Mock-Fault-After", "X-Mock-Retry-After", "X-Mock-Fault-First-N"} {
		if v := r.Header.Get(h); v != "" {
			ireq.Header.Set(h, v)
		}
	}
	resp, err := s.RoundTripper().RoundTrip(ireq)
	if err != nil {
		if r.Context().Err() == nil {
			panic(http.ErrAbortHandler)
		}
		return nil, false
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &e)
		for _, h := range []string{"Retry-After", "Retry-After-Ms"} {
			if v := resp.Header.Get(h); v != "" {
				w.Header().Set(h, v)
			}
		}
		writeErr(w, resp.StatusCode, e.Error.Message)
		return nil, false
	}
	return resp, true
}

// geminiResponse is a GenerateContentResponse of one candidate; u nil leaves usageMetadata out.
func geminiResponse(id, model, text, finish string, u *usage) map[string]any {
	cand := map[string]any{"content": map[string]any{"role": "model", "parts": []any{map[string]string{"text": text}}}, "index": 0}
	if finish != "" {
		cand["finishReason"] = geminiFinish(finish)
	}
	out := map[string]any{"candidates": []any{cand}, "modelVersion": model, "responseId": strings.TrimPrefix(id, idPrefix)}
	if u != nil {
		out["usageMetadata"] = map[string]int{"promptTokenCount": u.PromptTokens, "candidatesTokenCount": u.CompletionTokens, "totalTokenCount": u.TotalTokens}
	}
	return out
}

func geminiFinish(finish string) string {
	if finish == "length" {
		return "MAX_TOKENS"
	}
	return "STOP"
}

// geminiStream translates the chat mock's stream into Gemini's SSE events: one per token,
// and a last one with the finishReason and the usage.
func (s *Server) geminiStream(w http.ResponseWriter, body io.Reader) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(v any) {
		if _, err := w.Write(append(append([]byte("data: "), marshal(v)...), "\r\n\r\n"...)); err != nil {
			panic(http.ErrAbortHandler)
		}
		if flush(w) != nil {
			panic(http.ErrAbortHandler)
		}
	}
	er := openaiwire.NewEventReader(body)
	var id, model, finish string
	for {
		data, err := er.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler) // the inner stream broke: so does this one
		}
		if isInStreamError(data) {
			send(map[string]any{"error": map[string]any{"code": http.StatusInternalServerError, "message": "mock in-stream error", "status": "INTERNAL"}})
			return
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			panic(http.ErrAbortHandler)
		}
		id, model = c.ID, c.Model
		if len(c.Choices) == 0 { // the usage chunk ends the answer
			var u usage
			_ = json.Unmarshal(c.Usage, &u)
			send(geminiResponse(id, model, "", finish, &u))
			continue
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			send(geminiResponse(id, model, *ch.Delta.Content, "", nil))
		}
	}
}

// geminiStatus is the status name Google APIs give an HTTP status.
func geminiStatus(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	return "INTERNAL"
}

func writeGeminiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg, "status": geminiStatus(status)}})
}
