package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// relay turns a backend's SSE stream into chunks, coalescing the events one socket read
// delivered, and keeps what the record needs: every frame, the usage, the text so far (for
// a continuation), and how the stream ended.
type relay struct {
	ex        *execution
	anthropic bool
	native    bool // the OpenAI Responses API's named events, relayed as they are
	track     bool // accumulate text for a continuation

	all, pending, usageFrame []byte
	usage                    *kv.Usage
	contUsage                []kv.Usage
	text                     strings.Builder
	textTokens               int // content deltas sent so far (≈ tokens)
	prefixTokens             int // textTokens when the last continuation started
	resumed                  int
	// original identity of the stream, which continuation chunks are rewritten to.
	id, model string
	created   int64
	sawStop   bool // anthropic: message_stop seen
	blockIdx  int  // anthropic: index of the open content block
	broke     error
	// held are the frames of a stream's opening events, kept back until its first content
	// event (started); see firsttoken.go.
	held    []byte
	started bool
	// resend is the trailing whitespace an Anthropic prefill was sent without: the
	// continuation may generate it again, and the clients already have it.
	resend string
}

func newRelay(ex *execution) *relay {
	return &relay{ex: ex, anthropic: ex.job.API == backend.APIAnthropic, native: ex.job.API == backend.APIResponses}
}

func (r *relay) flush(ctx context.Context) error {
	if len(r.pending) == 0 {
		return nil
	}
	err := r.publish(ctx, jobs.KindData, r.pending)
	r.pending = nil
	return err
}

// publish writes one output chunk. A fence ends the execution (its epoch was taken over);
// any other failure (NATS stayed unavailable past the retry window, CHUNKS lost with a
// restart) loses the live feed but not the answer: the stream is read from the backend to
// its end and stored, no further chunk is written (a follower must never see a gap), and
// the followers answer from the record (execution.announce writes jobs.KindStored).
func (r *relay) publish(ctx context.Context, kind jobs.Kind, payload []byte) error {
	if r.ex.feedLost != nil {
		return nil
	}
	err := r.ex.pub.Publish(ctx, kind, 0, payload)
	if err == nil || errors.Is(err, jobs.ErrFenced) || ctx.Err() != nil {
		return err
	}
	r.ex.feedLost = err
	r.ex.log.Warn().Err(err).Int("chunks", r.ex.pub.Next()).Msg("live feed lost; reading the backend to the end, followers answer from the record")
	return nil
}

// sseEvent is one event read from a backend stream (err ends the stream).
type sseEvent struct {
	name string
	data []byte
	err  error
}

// run relays one backend stream; it reports whether the stream ended properly. A reader
// goroutine keeps reading the socket while a chunk is being published, and everything read
// meanwhile goes out in the next chunk (group commit): under a fast stream the chunk rate is
// bounded by the publish round trip instead of growing with every token. With a linger
// (workers.chunk_linger), a chunk also waits until linger has passed since the previous one,
// gathering what arrives meanwhile, so the rate is at most one chunk per linger; the first
// chunk and the end of the stream never wait. run closes body before it returns.
func (r *relay) run(ctx context.Context, body io.ReadCloser, continued bool) bool {
	events := make(chan sseEvent, 256)
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		er := openaiwire.NewEventReader(body)
		for {
			name, data, err := er.NextEvent()
			ev := sseEvent{name: name, data: bytes.Clone(data), err: err}
			select {
			case events <- ev:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		body.Close() // unblocks a reader waiting on the socket
		<-readerDone
	}()

	first := true
	linger := r.ex.pool.opts.ChunkLinger
	var lastFlush time.Time
	var lingerTimer *time.Timer
	if linger > 0 {
		lingerTimer = time.NewTimer(linger)
		lingerTimer.Stop()
		defer lingerTimer.Stop()
	}
	for {
		ev := <-events // one event: publish it as soon as it comes…
		for {
			if ev.err != nil {
				// Anthropic and Responses streams end after their terminal event, with no [DONE].
				clean := ev.err == io.EOF || ((r.anthropic || r.native) && r.sawStop && errors.Is(ev.err, openaiwire.ErrTruncated))
				if clean && r.broke == nil {
					r.begin() // a stream of opening events only (no content) is still an answer
				}
				if ferr := r.flush(ctx); ferr != nil {
					r.broke = ferr
					return false
				}
				if clean {
					return true
				}
				r.broke = ev.err
				r.ex.log.Warn().Err(ev.err).Int("chunks", r.ex.pub.Next()).Msg("backend stream broke")
				return false
			}
			if !r.started && !r.opening(ev.name, ev.data) {
				r.begin()
			}
			frame, publish := r.transform(ev.name, ev.data, continued, first)
			first = false
			if frame == nil && publish != nil {
				if err := publish(ctx); err != nil {
					r.broke = err
					return false
				}
			}
			switch {
			case frame == nil:
			case r.started:
				r.add(frame)
			default:
				r.held = append(r.held, frame...)
			}
			// …together with whatever else has already been read.
			if len(r.pending) >= coalesceBytes {
				break
			}
			select {
			case ev = <-events:
				continue
			default:
			}
			// …and, with a linger, whatever arrives until linger has passed since the last chunk.
			if wait := linger - time.Since(lastFlush); lingerTimer != nil && !lastFlush.IsZero() && wait > 0 && len(r.pending) > 0 {
				lingerTimer.Reset(wait)
				select {
				case ev = <-events:
					lingerTimer.Stop()
					continue
				case <-lingerTimer.C:
				case <-ctx.Done():
				}
			}
			break
		}
		if len(r.pending) > 0 {
			lastFlush = time.Now()
		}
		if err := r.flush(ctx); err != nil {
			r.broke = err
			return false
		}
	}
}

// add appends frame to the stream's frames and to the next chunk.
func (r *relay) add(frame []byte) {
	start := len(r.all)
	r.all = append(r.all, frame...)
	r.pending = r.all[start-len(r.pending) : len(r.all) : len(r.all)]
}

// transform maps one backend event to the frame clients get (nil: none), or to a separate
// publish (the OpenAI usage chunk).
func (r *relay) transform(event string, data []byte, continued, first bool) ([]byte, func(context.Context) error) {
	if r.anthropic {
		return r.anthropicEvent(event, data, continued)
	}
	if r.native {
		return r.responsesEvent(event, data), nil
	}
	if u, ok := openaiwire.UsageOnly(data); ok {
		usage := kv.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		if continued {
			// The continuation's usage is its own attempt (billed as such). The client gets
			// the usage of the one answer it saw: the continuation's prompt less the prefix it
			// was given, and the prefix's tokens plus the new ones (the prefix is counted in
			// content deltas, one per token for OpenAI-compatible servers).
			r.contUsage = append(r.contUsage, usage)
			prefix := r.prefixTokens
			whole := kv.Usage{PromptTokens: max(0, usage.PromptTokens-prefix), CompletionTokens: prefix + usage.CompletionTokens}
			whole.TotalTokens = whole.PromptTokens + whole.CompletionTokens
			r.usage = &whole
			data = r.usageChunk(whole)
		} else {
			r.usage = &usage
		}
		r.usageFrame = openaiwire.Frame(data)
		frame := r.usageFrame
		return nil, func(ctx context.Context) error {
			if err := r.flush(ctx); err != nil {
				return err
			}
			return r.publish(ctx, jobs.KindUsage, frame)
		}
	}
	if continued {
		var ok bool
		if data, ok = r.rewriteOpenAI(data, first); !ok {
			return nil, nil
		}
	} else if r.track {
		r.noteOpenAI(data)
	}
	r.ex.tokens.Add(1)
	return openaiwire.AppendFrame(nil, data), nil
}

// usageChunk is a usage-only chunk in the original stream's identity.
func (r *relay) usageChunk(u kv.Usage) []byte {
	b, _ := json.Marshal(map[string]any{"id": r.id, "object": "chat.completion.chunk", "created": r.created, "model": r.model,
		"choices": []any{}, "usage": map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.TotalTokens}})
	return b
}

type oaChunk struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// noteOpenAI remembers the stream's identity and its text, for a continuation.
func (r *relay) noteOpenAI(data []byte) {
	var c oaChunk
	if json.Unmarshal(data, &c) != nil {
		return
	}
	if r.id == "" {
		r.id, r.created, r.model = c.ID, c.Created, c.Model
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			r.text.WriteString(*ch.Delta.Content)
			r.textTokens++
		}
	}
}

// streamMeta is the "oncegate" member of a continued stream's final metadata (OpenAI's finish
// chunk, Anthropic's message_delta): how many continuations it took and the attempts in all.
// The Oncegate-Attempts header went out with the first chunk, before the continuations; this
// is the final figure, the one the record keeps. A stream that was not continued has no such
// member: its header was already final (attempts that broke before the first token are counted
// in it, see firsttoken.go), and its bytes stay those of the backend.
func (r *relay) streamMeta() json.RawMessage {
	b, _ := json.Marshal(struct {
		Resumed  int `json:"resumed"`
		Attempts int `json:"attempts"`
	}{r.resumed, r.ex.earlier + r.ex.attempts})
	return b
}

// rewriteOpenAI makes a continuation chunk part of the original stream: same id, created and
// model; the continuation's opening role-only chunk is dropped; the finish chunk is marked
// with the number of continuations. ok=false drops the chunk.
func (r *relay) rewriteOpenAI(data []byte, first bool) ([]byte, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data, true
	}
	var c oaChunk
	_ = json.Unmarshal(data, &c)
	if len(c.Choices) == 1 && c.Choices[0].Delta.Role != "" && (c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content == "") && c.Choices[0].FinishReason == nil {
		return nil, false
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			r.text.WriteString(*ch.Delta.Content)
			r.textTokens++
		}
		if ch.FinishReason != nil {
			m["oncegate"] = r.streamMeta()
		}
	}
	m["id"], _ = json.Marshal(r.id)
	m["created"], _ = json.Marshal(r.created)
	m["model"], _ = json.Marshal(r.model)
	out, err := json.Marshal(m)
	if err != nil {
		return data, true
	}
	return out, true
}

type anEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message struct {
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	} `json:"message"`
	Delta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// anthropicEvent keeps Anthropic's named events as they are, reading usage from message_start
// and the cumulative message_delta. In a continuation, the continuation's message_start and
// the reopening of the interrupted text block are dropped, so clients see one message.
func (r *relay) anthropicEvent(event string, data []byte, continued bool) ([]byte, func(context.Context) error) {
	var e anEvent
	_ = json.Unmarshal(data, &e)
	if event == "" {
		event = e.Type
	}
	switch e.Type {
	case "message_start":
		if continued {
			r.contUsage = append(r.contUsage, kv.Usage{PromptTokens: e.Message.Usage.InputTokens})
			return nil, nil
		}
		u := kv.Usage{PromptTokens: e.Message.Usage.InputTokens, CompletionTokens: e.Message.Usage.OutputTokens}
		r.usage = &u
	case "content_block_start":
		if continued && e.Index == 0 {
			return nil, nil
		}
		r.blockIdx = e.Index
	case "content_block_delta":
		if continued && r.resend != "" && e.Delta.Type == "text_delta" {
			var keep bool
			if data, e.Delta.Text, keep = r.dropResent(data, e.Index, e.Delta.Text); !keep {
				return nil, nil
			}
		}
		if e.Delta.Type == "text_delta" {
			r.text.WriteString(e.Delta.Text)
			r.textTokens++
		}
		r.ex.tokens.Add(1)
		if continued && e.Index == 0 && r.blockIdx != 0 {
			data = bytes.Replace(data, []byte(`"index":0`), []byte(fmt.Sprintf(`"index":%d`, r.blockIdx)), 1)
		}
	case "message_delta":
		if continued {
			data = r.continuedMessageDelta(data, e.Usage != nil)
		}
		if e.Usage != nil {
			if continued {
				// The continuation's usage is its own attempt (billed as such); the answer's
				// usage counts the prefix's tokens too, as the client's message_delta says.
				if n := len(r.contUsage); n > 0 {
					r.contUsage[n-1].CompletionTokens = e.Usage.OutputTokens
				}
				if r.usage != nil {
					r.usage.CompletionTokens = r.prefixTokens + e.Usage.OutputTokens
				}
			} else if r.usage != nil {
				r.usage.CompletionTokens = e.Usage.OutputTokens // cumulative: assign, never add
			}
		}
	case "message_stop":
		r.sawStop = true
	case "error":
		r.broke = errors.New("anthropic stream error event")
	}
	return openaiwire.AppendNamedFrame(nil, event, data), nil
}

// responsesEvent keeps a Responses API event as it is, reading the usage from the terminal
// event's response and counting text deltas as tokens. A Responses stream is never continued.
func (r *relay) responsesEvent(event string, data []byte) []byte {
	var e struct {
		Type     string `json:"type"`
		Response *struct {
			Usage *struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
				TotalTokens  int `json:"total_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	_ = json.Unmarshal(data, &e)
	if event == "" {
		event = e.Type
	}
	switch e.Type {
	case "response.output_text.delta", "response.function_call_arguments.delta", "response.refusal.delta":
		r.ex.tokens.Add(1)
	case "response.completed", "response.incomplete", "response.failed":
		r.sawStop = true
		if e.Response != nil && e.Response.Usage != nil {
			u := e.Response.Usage
			r.usage = &kv.Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.TotalTokens}
		}
	case "error":
		r.broke = errors.New("responses stream error event")
	}
	return openaiwire.AppendNamedFrame(nil, event, data)
}

// continuedMessageDelta is a continuation's message_delta as the clients get it: with the
// final metadata (streamMeta) and, in its usage, the output tokens of the one answer they saw
// (the prefix's, counted in text deltas, plus the continuation's own).
func (r *relay) continuedMessageDelta(data []byte, hasUsage bool) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data
	}
	m["oncegate"] = r.streamMeta()
	var u map[string]json.RawMessage
	if hasUsage && json.Unmarshal(m["usage"], &u) == nil {
		var out int
		_ = json.Unmarshal(u["output_tokens"], &out)
		u["output_tokens"], _ = json.Marshal(r.prefixTokens + out)
		m["usage"], _ = json.Marshal(u)
	}
	out, err := json.Marshal(m)
	if err != nil {
		return data
	}
	return out
}

// dropResent removes from a continuation's text delta the whitespace the prefill was sent
// without (r.resend), which the clients already have; keep=false drops the whole event.
// Whatever follows that whitespace is new text, so stripping stops at the first other byte.
func (r *relay) dropResent(data []byte, index int, text string) ([]byte, string, bool) {
	n := 0
	for n < len(text) && n < len(r.resend) && text[n] == r.resend[n] {
		n++
	}
	if n == len(text) {
		r.resend = r.resend[n:]
		return nil, "", false
	}
	r.resend = ""
	if n == 0 {
		return data, text, true
	}
	text = text[n:]
	out, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": index,
		"delta": map[string]string{"type": "text_delta", "text": text}})
	return out, text, true
}

// canContinue: the stream broke after output and the backend can continue it.
func (r *relay) canContinue(b Backend) bool {
	if r.native || r.broke == nil || errors.Is(r.broke, jobs.ErrFenced) || r.text.Len() == 0 || r.resumed >= 2 {
		return false
	}
	cfg := b.Config()
	switch cfg.Continuation {
	case config.ContinuationVLLM:
		return !r.anthropic
	case config.ContinuationAnthropic:
		return r.anthropic && slices.Contains(cfg.PrefillModels, r.ex.job.Model)
	}
	return false
}

// continuation asks the backend to go on from the text already sent: vLLM with the partial
// answer as an open final assistant message (continue_final_message), Anthropic with the
// partial answer as assistant prefill. Only the new tokens reach the clients.
func (r *relay) continuation(ctx context.Context, b Backend) (*http.Response, context.CancelFunc, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(r.ex.job.Body, &req); err != nil {
		return nil, nil, fmt.Errorf("workers: continuation: %w", err)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(req["messages"], &msgs); err != nil {
		return nil, nil, fmt.Errorf("workers: continuation messages: %w", err)
	}
	partial := r.text.String()
	if r.anthropic {
		// Anthropic refuses a prefill that ends in whitespace: it is sent without, and the
		// whitespace the backend then generates again is not sent twice (resend).
		trimmed := strings.TrimRightFunc(partial, unicode.IsSpace)
		r.resend, partial = partial[len(trimmed):], trimmed
	}
	prefill, _ := json.Marshal(map[string]string{"role": "assistant", "content": partial})
	msgs = append(msgs, prefill)
	req["messages"], _ = json.Marshal(msgs)
	if !r.anthropic {
		req["continue_final_message"] = json.RawMessage("true")
		req["add_generation_prompt"] = json.RawMessage("false")
		req["echo"] = json.RawMessage("false")
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	report, err := r.ex.pool.guard(b.Name()).breaker.Allow(ctx)
	if err != nil {
		// Open, most likely on this stream's own break: the breaker keeps new load away, and
		// a continuation is not new load but the end of a call it admitted (issue 34: the
		// breaker refused it and the client got a truncated stream). It goes out unreported.
		report = func(bool) {}
	}
	r.ex.attempts++
	r.ex.pub.SetMeta(r.ex.meta()) // the terminal chunk says how many attempts it took
	r.ex.noteSent(b.Name(), r.ex.attempts)
	r.resumed++
	r.broke = nil
	r.prefixTokens = r.textTokens
	resp, cancel, err := b.Send(ctx, &backend.Call{API: r.ex.api(), Body: body, Stream: true, Header: r.ex.job.Header})
	r.ex.pool.countAttempt(b.Name(), resp, err, true) // a continuation is a retry of the broken attempt
	if err != nil {
		report(false)
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		report(false)
		resp.Body.Close()
		cancel()
		return nil, nil, fmt.Errorf("workers: continuation status %d", resp.StatusCode)
	}
	report(true)
	r.ex.log.Info().Int("resumed", r.resumed).Int("prefix_bytes", len(partial)).Msg("continuing a broken stream")
	return resp, cancel, nil
}

// finish stores the outcome: COMPLETED with every frame, or — when the stream broke and could
// not be continued — the partial output with an explicit error (never a silent end, never a
// repeated prefix).
func (r *relay) finish(ctx context.Context, ok bool) {
	ex := r.ex
	if r.broke != nil && (errors.Is(r.broke, jobs.ErrFenced) || errors.Is(r.broke, kv.ErrConflict)) {
		ex.abandon(r.broke)
		return
	}
	if !ok {
		if len(r.all) == 0 {
			ex.finishFailed(ctx, &failure{status: http.StatusBadGateway, body: ex.errorBody(http.StatusBadGateway, "backend_truncated",
				"the model backend's stream ended before any output")})
			return
		}
		res := &kv.Result{Status: http.StatusOK, Events: r.all, Partial: true, Resumed: r.resumed, ContinuationUsage: r.contUsage,
			Body: streamErrorBody(r.anthropic)}
		ex.finishFailedAfterOutput(ctx, res)
		return
	}
	res := &kv.Result{Status: http.StatusOK, Events: r.all, UsageEvent: r.usageFrame, Usage: r.usage,
		Resumed: r.resumed, ContinuationUsage: r.contUsage}
	if r.usage != nil && r.usage.TotalTokens == 0 {
		r.usage.TotalTokens = r.usage.PromptTokens + r.usage.CompletionTokens
	}
	ex.finishCompleted(ctx, res, jobs.KindDone)
}

// streamErrorBody is the terminal error event of a stream that broke after output.
func streamErrorBody(anthropic bool) []byte {
	const msg = "the model backend's stream broke after partial output and could not be continued; not retried to avoid a repeated prefix"
	if anthropic {
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": "api_error", "message": msg}})
		return b
	}
	return openaiwire.ErrorBody(msg, "server_error", "stream_interrupted", "")
}

// usageOf reads the usage of a non-stream answer of either API.
func usageOf(api string, body []byte) *kv.Usage {
	if api == backend.APIAnthropic {
		var m struct {
			Usage *struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(body, &m) != nil || m.Usage == nil {
			return nil
		}
		return &kv.Usage{PromptTokens: m.Usage.InputTokens, CompletionTokens: m.Usage.OutputTokens, TotalTokens: m.Usage.InputTokens + m.Usage.OutputTokens}
	}
	u := openaiwire.UsageOf(body)
	if u == nil {
		return nil
	}
	return &kv.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}
