package mockllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/oncegate/oncegate/internal/openaiwire"
)

// The errors Azure OpenAI answers before a request reaches a model (their documented shape,
// {"error": {"code", "message"}}).
const (
	azureNotFound      = "Resource not found"
	azureAccessDenied  = "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."
	azureNoDeployment  = "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again."
	azureFilteredInput = "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry."
)

// azurePromptFilter is the chunk an Azure stream opens with, and the prompt_filter_results
// member of a non-stream answer.
const azurePromptFilter = `[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}}]`

// serveAzure speaks Azure OpenAI's chat completions on top of the chat mock:
//
//	POST /openai/deployments/{deployment}/chat/completions?api-version={version}
//
// As Azure does, a request without api-version answers 404 "Resource not found", one
// without an api-key header 401, one to a deployment that is not one of the mock's models
// 404 DeploymentNotFound (any non-empty key and version are accepted). The body is the chat
// request, run as the deployment's model (the body's "model" is ignored, as Azure ignores
// it), with the same knobs and faults; X-Mock-Fault: content_filter answers Azure's 400 for
// a prompt its content filter refused (this path only). A non-stream answer carries
// prompt_filter_results; a stream opens with Azure's prompt-filter chunk (no choices), then
// the chat mock's chunks as they are and [DONE]. Errors are {"error": {"code", "message"}},
// the code the status as text.
func (s *Server) serveAzure(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/openai/deployments/")
	deployment, op, _ := strings.Cut(rest, "/")
	switch {
	case op != "chat/completions" || r.URL.Query().Get("api-version") == "":
		writeAzureError(w, http.StatusNotFound, "404", azureNotFound)
		return
	case r.Header.Get("api-key") == "":
		writeAzureError(w, http.StatusUnauthorized, "401", azureAccessDenied)
		return
	case !s.known[deployment]:
		writeAzureError(w, http.StatusNotFound, "DeploymentNotFound", azureNoDeployment)
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		writeAzureError(w, http.StatusBadRequest, "400", "could not read the request body")
		return
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		writeAzureError(w, http.StatusBadRequest, "400", "We could not parse the JSON body of your request.")
		return
	}
	if r.Header.Get("X-Mock-Fault") == "content_filter" {
		s.requests.Add(1)
		s.faults.Add(1)
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": azureFilteredInput, "type": nil, "param": "prompt",
			"code": "content_filter", "status": http.StatusBadRequest, "innererror": map[string]any{"code": "ResponsibleAIPolicyViolation",
				"content_filter_result": map[string]any{"hate": map[string]any{"filtered": true, "severity": "medium"}}}}})
		return
	}
	chat := make(map[string]any, len(members)+1)
	for k, v := range members {
		chat[k] = v
	}
	chat["model"] = deployment
	stream := string(members["stream"]) == "true"
	resp, ok := s.inner(w, r, chat, func(w http.ResponseWriter, status int, msg string) {
		writeAzureError(w, status, strconv.Itoa(status), msg)
	})
	if !ok {
		return
	}
	defer resp.Body.Close()
	if !stream {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		b = bytes.TrimRight(b, "\n")
		if len(b) < 2 || b[len(b)-1] != '}' {
			writeAzureError(w, http.StatusInternalServerError, "500", "mock: inner answer unreadable")
			return
		}
		b = append(b[:len(b)-1:len(b)-1], `,"prompt_filter_results":`+azurePromptFilter+"}\n"...)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b) // #nosec G705 -- the mock backend's JSON body, served as application/json
		return
	}
	s.azureStream(w, resp.Body)
}

// azureStream writes Azure's prompt-filter chunk, then the chat mock's events and [DONE]; a
// break of the inner stream breaks this one.
func (s *Server) azureStream(w http.ResponseWriter, body io.Reader) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(data []byte) {
		if _, err := w.Write(openaiwire.Frame(data)); err != nil {
			panic(http.ErrAbortHandler)
		}
		if flush(w) != nil {
			panic(http.ErrAbortHandler)
		}
	}
	send([]byte(`{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":` + azurePromptFilter + `}`))
	er := openaiwire.NewEventReader(body)
	for {
		data, err := er.Next()
		if errors.Is(err, io.EOF) {
			send([]byte("[DONE]"))
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler) // the inner stream broke: so does this one
		}
		send(data)
	}
}

func writeAzureError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg}})
}
