package responseswire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Response statuses.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusFailed     = "failed"
	StatusCancelled  = "cancelled"
)

// Meta is what a response object says besides its output: its id, when it was created, the
// model asked for, and the request fields it repeats (Echo.Params).
type Meta struct {
	ID        string
	CreatedAt int64
	Model     string
	Params    json.RawMessage
	// Native: the frames are a Responses backend's own events (responses: native), relayed
	// renumbered and with this response's id instead of the backend's; nothing is added.
	Native bool
}

// IDOf is the response id of a job; JobOf is the job id of a response id.
func IDOf(jobID string) string { return "resp_" + jobID }

// JobOf returns the job id a response id names ("" when id is not one).
func JobOf(id string) string {
	job, ok := strings.CutPrefix(id, "resp_")
	if !ok {
		return ""
	}
	return job
}

// Stream renders a chat completions stream as the Responses event stream. Feed it the chat
// frames in order (any grouping), then end it with Complete or Fail. Events numbered up to
// After are counted but not written: a resumed stream (starting_after) gets the same
// sequence numbers as the first. Not safe for concurrent use.
type Stream struct {
	meta  Meta
	After int // events with sequence_number <= After are skipped (-1: none)

	seq     int // the next event's sequence number
	out     []byte
	started bool
	ended   bool
	items   []*outputItem
	text    *outputItem         // the message item taking text deltas, if open
	tools   map[int]*outputItem // function calls by the chat tool call index
	usage   *usage
	finish  string
	// rest is the end of the frames fed that did not yet close a frame.
	rest []byte
	// native: the last response object a native backend's events carried (its id replaced),
	// and whether its terminal event passed.
	nativeResp     json.RawMessage
	nativeTerminal bool
}

type outputItem struct {
	index  int
	id     string
	call   bool // a function call; else a message
	text   strings.Builder
	callID string
	name   string
	done   bool
}

// NewStream starts rendering the response meta describes.
func NewStream(meta Meta) *Stream {
	return &Stream{meta: meta, After: -1, tools: map[int]*outputItem{}}
}

// Seq is the sequence number the next event gets (the count of events so far).
func (s *Stream) Seq() int { return s.seq }

// take returns what was rendered since the last take.
func (s *Stream) take() []byte {
	out := s.out
	s.out = nil
	return out
}

// Start writes response.created and response.in_progress (once; Frames and the ends call it).
func (s *Stream) Start() []byte {
	s.start()
	return s.take()
}

func (s *Stream) start() {
	if s.started {
		return
	}
	s.started = true
	if s.meta.Native { // the backend's own response.created comes with the frames
		return
	}
	obj := s.object(StatusInProgress, nil, nil)
	s.emit("response.created", struct {
		Response json.RawMessage `json:"response"`
	}{obj})
	s.emit("response.in_progress", struct {
		Response json.RawMessage `json:"response"`
	}{obj})
}

// Frames renders chat SSE frames (data chunks, the usage chunk); a frame cut at the end of
// b is completed by the next call.
func (s *Stream) Frames(b []byte) ([]byte, error) {
	s.start()
	if len(s.rest) > 0 {
		b = append(s.rest, b...)
		s.rest = nil
	}
	for len(b) > 0 {
		frame, rest, found := bytes.Cut(b, []byte("\n\n"))
		if !found {
			s.rest = bytes.Clone(frame)
			break
		}
		b = rest
		data := frameData(frame)
		if len(data) == 0 || string(data) == "[DONE]" {
			continue
		}
		if err := s.chunk(data); err != nil {
			return s.take(), err
		}
	}
	return s.take(), nil
}

// frameData is the data of one SSE frame (its data lines joined).
func frameData(frame []byte) []byte {
	var data []byte
	n := 0
	for _, line := range bytes.Split(frame, []byte("\n")) {
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		if n > 0 {
			data = append(data, '\n')
		}
		data = append(data, v...)
		n++
	}
	return data
}

type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content   *string `json:"content"`
			Refusal   *string `json:"refusal"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// chunk renders one frame's data: a chat chunk, or an event of an Anthropic Messages stream
// (those name their type; chat chunks do not).
func (s *Stream) chunk(data []byte) error {
	var probe struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return fmt.Errorf("responseswire: a stream event: %w", err)
	}
	if s.meta.Native {
		return s.nativeEvent(probe.Type, data)
	}
	if probe.Type != "" {
		if err := s.anthropicChunk(data); err != nil {
			return fmt.Errorf("responseswire: a Messages event: %w", err)
		}
		return nil
	}
	var ch chatChunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return fmt.Errorf("responseswire: a chat chunk: %w", err)
	}
	if ch.Usage != nil {
		s.usage = usageOf(ch.Usage)
	}
	for _, c := range ch.Choices {
		d := c.Delta
		if d.Content != nil && *d.Content != "" {
			s.textDelta(*d.Content)
		}
		if d.Refusal != nil && *d.Refusal != "" {
			s.textDelta(*d.Refusal)
		}
		for _, tc := range d.ToolCalls {
			it := s.tools[tc.Index]
			if it == nil {
				it = s.openCall(tc.Index, tc.ID, tc.Function.Name)
			}
			if tc.Function.Arguments != "" {
				s.argsDelta(it, tc.Function.Arguments)
			}
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			s.finish = *c.FinishReason
		}
	}
	return nil
}

// openCall starts a function call item, the chat tool call (or Anthropic block) index's.
func (s *Stream) openCall(index int, callID, name string) *outputItem {
	s.closeText()
	it := s.addItem(true)
	it.callID, it.name = callID, name
	s.tools[index] = it
	s.emit("response.output_item.added", struct {
		OutputIndex int             `json:"output_index"`
		Item        json.RawMessage `json:"item"`
	}{it.index, s.itemJSON(it)})
	return it
}

func (s *Stream) argsDelta(it *outputItem, delta string) {
	it.text.WriteString(delta)
	s.emit("response.function_call_arguments.delta", struct {
		ItemID      string `json:"item_id"`
		OutputIndex int    `json:"output_index"`
		Delta       string `json:"delta"`
	}{it.id, it.index, delta})
}

func (s *Stream) addItem(call bool) *outputItem {
	idx := len(s.items)
	prefix := "msg_"
	if call {
		prefix = "fc_"
	}
	it := &outputItem{index: idx, call: call, id: prefix + strings.TrimPrefix(s.meta.ID, "resp_") + "_" + strconv.Itoa(idx)}
	s.items = append(s.items, it)
	return it
}

func (s *Stream) textDelta(delta string) {
	if s.text == nil {
		it := s.addItem(false)
		s.text = it
		s.emit("response.output_item.added", struct {
			OutputIndex int             `json:"output_index"`
			Item        json.RawMessage `json:"item"`
		}{it.index, s.itemJSON(it)})
		s.emit("response.content_part.added", partEvent{ItemID: it.id, OutputIndex: it.index, Part: textPart("")})
	}
	s.text.text.WriteString(delta)
	s.emit("response.output_text.delta", textDeltaEvent{ItemID: s.text.id, OutputIndex: s.text.index, Delta: delta, Logprobs: []any{}})
}

type partEvent struct {
	ItemID       string          `json:"item_id"`
	OutputIndex  int             `json:"output_index"`
	ContentIndex int             `json:"content_index"`
	Part         json.RawMessage `json:"part"`
}

type textDeltaEvent struct {
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Delta        string `json:"delta"`
	Logprobs     []any  `json:"logprobs"`
}

type textDoneEvent struct {
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Text         string `json:"text"`
	Logprobs     []any  `json:"logprobs"`
}

func textPart(text string) json.RawMessage {
	return mustJSON(struct {
		Type        string `json:"type"`
		Annotations []any  `json:"annotations"`
		Logprobs    []any  `json:"logprobs"`
		Text        string `json:"text"`
	}{"output_text", []any{}, []any{}, text})
}

// closeText ends the open message item.
func (s *Stream) closeText() {
	it := s.text
	if it == nil {
		return
	}
	s.text = nil
	text := it.text.String()
	s.emit("response.output_text.done", textDoneEvent{ItemID: it.id, OutputIndex: it.index, Text: text, Logprobs: []any{}})
	s.emit("response.content_part.done", partEvent{ItemID: it.id, OutputIndex: it.index, Part: textPart(text)})
	it.done = true
	s.emit("response.output_item.done", struct {
		OutputIndex int             `json:"output_index"`
		Item        json.RawMessage `json:"item"`
	}{it.index, s.itemJSON(it)})
}

// closeAll ends every open item, in output order.
func (s *Stream) closeAll() {
	s.closeText()
	for _, it := range s.items {
		if it.done || !it.call {
			continue
		}
		it.done = true
		s.emit("response.function_call_arguments.done", struct {
			ItemID      string `json:"item_id"`
			OutputIndex int    `json:"output_index"`
			Name        string `json:"name"`
			Arguments   string `json:"arguments"`
		}{it.id, it.index, it.name, it.text.String()})
		s.emit("response.output_item.done", struct {
			OutputIndex int             `json:"output_index"`
			Item        json.RawMessage `json:"item"`
		}{it.index, s.itemJSON(it)})
	}
}

func (s *Stream) itemJSON(it *outputItem) json.RawMessage {
	status := StatusInProgress
	if it.done {
		status = StatusCompleted
	}
	if it.call {
		return mustJSON(struct {
			ID        string `json:"id"`
			Type      string `json:"type"`
			Status    string `json:"status"`
			Arguments string `json:"arguments"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
		}{it.id, "function_call", status, it.text.String(), it.callID, it.name})
	}
	content := []json.RawMessage{}
	if it.done {
		content = append(content, textPart(it.text.String()))
	}
	return mustJSON(struct {
		ID      string            `json:"id"`
		Type    string            `json:"type"`
		Status  string            `json:"status"`
		Content []json.RawMessage `json:"content"`
		Role    string            `json:"role"`
	}{it.id, "message", status, content, "assistant"})
}

// Complete ends a stream the backend finished: response.completed, or response.incomplete
// when it stopped at the token limit or a content filter.
func (s *Stream) Complete() []byte {
	s.start()
	if s.ended {
		return s.take()
	}
	s.ended = true
	if s.meta.Native {
		if !s.nativeTerminal { // a stream stored complete always ends with its terminal event
			s.emitBody("response.completed", mustJSON(struct {
				Response json.RawMessage `json:"response"`
			}{s.Response(StatusCompleted)}))
		}
		return s.take()
	}
	s.closeAll()
	status, details := s.final()
	s.emit("response."+status, struct {
		Response json.RawMessage `json:"response"`
	}{s.object(status, details, nil)})
	return s.take()
}

func (s *Stream) final() (string, *incompleteDetails) {
	switch s.finish {
	case "length":
		return StatusIncomplete, &incompleteDetails{Reason: "max_output_tokens"}
	case "content_filter":
		return StatusIncomplete, &incompleteDetails{Reason: "content_filter"}
	}
	return StatusCompleted, nil
}

// Fail ends a stream with response.failed (status failed, or cancelled), carrying the error.
func (s *Stream) Fail(status, code, message string) []byte {
	s.start()
	if s.ended {
		return s.take()
	}
	s.ended = true
	s.emit("response.failed", struct {
		Response json.RawMessage `json:"response"`
	}{s.object(status, nil, &respError{Code: code, Message: message})})
	return s.take()
}

// Response is the response object as the stream left it: status, when the stream was
// completed, is the final one (completed or incomplete).
func (s *Stream) Response(status string) []byte {
	if s.meta.Native && s.nativeResp != nil && status == StatusCompleted {
		return s.nativeResp
	}
	var details *incompleteDetails
	if status == StatusCompleted {
		status, details = s.final()
	}
	return s.object(status, details, nil)
}

// FailedResponse is the response object of a failed (or cancelled) execution.
func (s *Stream) FailedResponse(status, code, message string) []byte {
	return s.object(status, nil, &respError{Code: code, Message: message})
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type respError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type usage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

type inputTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type outputTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

func usageOf(u *chatUsage) *usage {
	out := &usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.PromptTokensDetails != nil {
		out.InputTokensDetails.CachedTokens = u.PromptTokensDetails.CachedTokens
	}
	if u.CompletionTokensDetails != nil {
		out.OutputTokensDetails.ReasoningTokens = u.CompletionTokensDetails.ReasoningTokens
	}
	return out
}

// object is the response object now.
func (s *Stream) object(status string, details *incompleteDetails, e *respError) []byte {
	output := make([]json.RawMessage, 0, len(s.items))
	for _, it := range s.items {
		output = append(output, s.itemJSON(it))
	}
	var u *usage
	if status == StatusCompleted || status == StatusIncomplete {
		u = s.usage
	}
	head := mustJSON(struct {
		ID                string             `json:"id"`
		Object            string             `json:"object"`
		CreatedAt         int64              `json:"created_at"`
		Status            string             `json:"status"`
		Error             *respError         `json:"error"`
		IncompleteDetails *incompleteDetails `json:"incomplete_details"`
		Model             string             `json:"model"`
		Output            []json.RawMessage  `json:"output"`
		Usage             *usage             `json:"usage"`
	}{s.meta.ID, "response", s.meta.CreatedAt, status, e, details, s.meta.Model, output, u})
	// The request's fields follow: splice the stored params object in.
	p := bytes.TrimSpace(s.meta.Params)
	if len(p) < 2 || string(p) == "{}" {
		return head
	}
	out := make([]byte, 0, len(head)+len(p))
	out = append(out, head[:len(head)-1]...)
	out = append(out, ',')
	return append(out, p[1:]...)
}

// emit writes one event, numbered, unless it is at or before After.
func (s *Stream) emit(typ string, v any) { s.emitBody(typ, mustJSON(v)) }

// emitBody is emit of an event's fields as a JSON object (type and sequence_number go first).
func (s *Stream) emitBody(typ string, body []byte) {
	seq := s.seq
	s.seq++
	if seq <= s.After {
		return
	}
	s.out = append(s.out, "event: "...)
	s.out = append(s.out, typ...)
	s.out = append(s.out, "\ndata: {\"type\":"...)
	s.out = append(s.out, mustJSON(typ)...)
	s.out = append(s.out, ",\"sequence_number\":"...)
	s.out = strconv.AppendInt(s.out, int64(seq), 10)
	if len(body) > 2 {
		s.out = append(s.out, ',')
		s.out = append(s.out, body[1:]...)
	} else {
		s.out = append(s.out, '}')
	}
	s.out = append(s.out, "\n\n"...)
}

// Conversation is the chat messages that continue a stored response: its own (Echo.Messages)
// and its output as the assistant's turn.
func (s *Stream) Conversation(e *Echo) []json.RawMessage {
	out := append([]json.RawMessage{}, e.Messages...)
	var text strings.Builder
	var calls []chatToolCall
	for _, it := range s.items {
		if it.call {
			calls = append(calls, chatToolCall{ID: it.callID, Type: "function", Function: chatFunction{Name: it.name, Arguments: it.text.String()}})
		} else {
			text.WriteString(it.text.String())
		}
	}
	if text.Len() == 0 && len(calls) == 0 {
		return out
	}
	m := chatMessage{Role: "assistant", Content: json.RawMessage("null"), ToolCalls: calls}
	if text.Len() > 0 {
		m.Content = jsonString(text.String())
	}
	return append(out, mustJSON(m))
}

// nativeEvent relays one event of a native Responses backend: numbered by this stream, its
// response object (if it carries one) under this response's id.
func (s *Stream) nativeEvent(typ string, data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || typ == "" {
		return fmt.Errorf("responseswire: a Responses event: %w", errors.Join(err, errMalformed))
	}
	delete(fields, "type")
	delete(fields, "sequence_number")
	if raw, ok := fields["response"]; ok {
		var resp map[string]json.RawMessage
		if err := json.Unmarshal(raw, &resp); err == nil {
			resp["id"] = mustJSON(s.meta.ID)
			fields["response"] = mustJSON(resp)
			s.nativeResp = fields["response"]
		}
	}
	switch typ {
	case "response.completed", "response.incomplete", "response.failed":
		s.nativeTerminal = true
	}
	s.emitBody(typ, mustJSON(fields))
	return nil
}

// UpstreamID is the id a native Responses backend gave the response whose events are frames
// ("" if none): a continuation of it (previous_response_id) is sent under that id.
func UpstreamID(frames []byte) string {
	for len(frames) > 0 {
		frame, rest, _ := bytes.Cut(frames, []byte("\n\n"))
		frames = rest
		var ev struct {
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal(frameData(frame), &ev) == nil && ev.Response.ID != "" {
			return ev.Response.ID
		}
	}
	return ""
}
