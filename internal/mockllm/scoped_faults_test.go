package mockllm

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestFaultFirstN: the fault applies to the first N requests of its scope (messages + model),
// then requests are answered normally; other scopes count on their own.
func TestFaultFirstN(t *testing.T) {
	tests := []struct {
		name   string
		mock   map[string]any
		hdr    map[string]string
		stream bool
		want   []int // status of consecutive requests of one scope
	}{
		{"503 burst of 2 via body", map[string]any{"fault": "error_503", "fault_first_n": 2}, nil, false, []int{503, 503, 200, 200}},
		{"429 then OK via headers", nil, map[string]string{"X-Mock-Fault": "rate_limit", "X-Mock-Fault-First-N": "1"}, false, []int{429, 200, 200}},
		{"header wins over body", map[string]any{"fault": "error_502", "fault_first_n": 5}, map[string]string{"X-Mock-Fault-First-N": "1"}, true, []int{502, 200}},
		{"zero: never faulted", map[string]any{"fault": "error_500", "fault_first_n": 0}, nil, false, []int{200, 200}},
		{"without fault_first_n: always", map[string]any{"fault": "error_504"}, nil, false, []int{504, 504, 504}},
		{"400 first 3", map[string]any{"fault": "error_400", "fault_first_n": 3}, nil, true, []int{400, 400, 400, 200}},
	}
	forEachTransport(t, Options{Tokens: 4}, func(t *testing.T, h *harness) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				h.srv.Reset()
				fields := map[string]any{"stream": tt.stream}
				if tt.mock != nil {
					fields["mock"] = tt.mock
				}
				var faults int64
				for i, want := range tt.want {
					resp, data := h.chat(t, chatReq(t, fields), tt.hdr)
					if resp.StatusCode != want {
						t.Fatalf("request %d: status %d, want %d: %s", i+1, resp.StatusCode, want, data)
					}
					if want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "1" {
						t.Errorf("429 without Retry-After: %v", resp.Header)
					}
					if want != http.StatusOK {
						faults++
					}
				}
				st := settle(t, h.srv)
				if st.Requests != int64(len(tt.want)) || st.Faults != faults || st.Completed != int64(len(tt.want))-faults {
					t.Errorf("stats %+v, want %d requests, %d faults", st, len(tt.want), faults)
				}
			})
		}
	})
}

// TestFaultFirstNScope: the scope is the messages and the model, not the knobs; Reset forgets it.
func TestFaultFirstNScope(t *testing.T) {
	forEachTransport(t, Options{Tokens: 2, Models: []string{"oncegate-mock", "oncegate-other"}}, func(t *testing.T, h *harness) {
		knob := map[string]any{"fault": "error_503", "fault_first_n": 1}
		status := func(fields map[string]any) int {
			t.Helper()
			resp, _ := h.chat(t, chatReq(t, fields), nil)
			return resp.StatusCode
		}
		a := map[string]any{"mock": knob}
		b := map[string]any{"mock": knob, "messages": []any{map[string]any{"role": "user", "content": "another scope"}}}
		c := map[string]any{"mock": knob, "model": "oncegate-other"}
		// Same messages and model, other knobs: the same scope.
		a2 := map[string]any{"stream": true, "mock": map[string]any{"fault": "error_502", "fault_first_n": 1, "tokens": 3}}
		for i, step := range []struct {
			fields map[string]any
			want   int
		}{{a, 503}, {b, 503}, {c, 503}, {a, 200}, {b, 200}, {c, 200}, {a2, 200}} {
			if got := status(step.fields); got != step.want {
				t.Errorf("step %d: status %d, want %d", i, got, step.want)
			}
		}
		h.srv.Reset()
		if got := status(a); got != 503 {
			t.Errorf("after Reset: %d, want 503", got)
		}
	})
}

// TestFaultFirstNConcurrent: N faults exactly, whatever the interleaving.
func TestFaultFirstNConcurrent(t *testing.T) {
	forEachTransport(t, Options{Tokens: 2}, func(t *testing.T, h *harness) {
		const n, first = 30, 7
		var wg sync.WaitGroup
		codes := make([]int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := h.doCtx(t.Context(), http.MethodPost, "/v1/chat/completions", chatReq(t, nil),
					map[string]string{"X-Mock-Fault": "error_503", "X-Mock-Fault-First-N": strconv.Itoa(first)})
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes[i] = resp.StatusCode
			}()
		}
		wg.Wait()
		got := map[int]int{}
		for _, c := range codes {
			got[c]++
		}
		if got[503] != first || got[200] != n-first {
			t.Errorf("statuses %v, want %d×503 and %d×200", got, first, n-first)
		}
		if st := settle(t, h.srv); st != (Stats{Requests: n, Completed: n - first, Faults: first}) {
			t.Errorf("stats %+v", st)
		}
	})
}

func TestFaultFirstNBadKnob(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tc := range []struct {
			fields map[string]any
			hdr    map[string]string
			param  string
		}{
			{map[string]any{"mock": map[string]any{"fault": "error_503", "fault_first_n": -1}}, nil, "mock.fault_first_n"},
			{nil, map[string]string{"X-Mock-Fault": "error_503", "X-Mock-Fault-First-N": "two"}, "X-Mock-Fault-First-N"},
		} {
			resp, data := h.chat(t, chatReq(t, tc.fields), tc.hdr)
			e := decode[wireError](t, data)
			if resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != tc.param {
				t.Errorf("%d %s, want 400 on %s", resp.StatusCode, data, tc.param)
			}
		}
	})
}

// TestNewErrorFaults: the 4xx faults added for the retry rules.
func TestNewErrorFaults(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tc := range []struct {
			fault  string
			status int
		}{{"error_403", 403}, {"error_404", 404}, {"error_422", 422}} {
			h.srv.Reset()
			resp, data := h.chat(t, chatReq(t, map[string]any{"mock": map[string]any{"fault": tc.fault}}), nil)
			e := decode[wireError](t, data)
			if resp.StatusCode != tc.status || e.Error.Type != "invalid_request_error" || e.Error.Message != "mock: injected "+strconv.Itoa(tc.status) {
				t.Errorf("%s: %d %s", tc.fault, resp.StatusCode, data)
			}
			if st := settle(t, h.srv); st != (Stats{Requests: 1, Faults: 1}) {
				t.Errorf("%s: stats %+v", tc.fault, st)
			}
		}
	})
}

// TestLostResponse: the answer is generated (it takes as long as a real one and is counted
// Completed), then the connection is aborted before any response byte.
func TestLostResponse(t *testing.T) {
	for _, stream := range []bool{false, true} {
		forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
			body := chatReq(t, map[string]any{"stream": stream, "mock": map[string]any{"fault": "lost_response", "ttft_ms": 30, "inter_token_ms": 2, "tokens": 5}})
			start := time.Now()
			resp, err := h.doCtx(t.Context(), http.MethodPost, "/v1/chat/completions", body, nil)
			if err == nil {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("lost_response answered %d %q", resp.StatusCode, data)
			}
			if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Logf("error: %v", err) // a closed connection; any error is acceptable
			}
			// Lower bound: the whole answer was generated first.
			if d := time.Since(start); d < 30*time.Millisecond+5*2*time.Millisecond {
				t.Errorf("failed after %v, before the answer was generated", d)
			}
			if st := settle(t, h.srv); st != (Stats{Requests: 1, Completed: 1, Faults: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestLostResponseFirstN: "lost once, then answered".
func TestLostResponseFirstN(t *testing.T) {
	forEachTransport(t, Options{Tokens: 3}, func(t *testing.T, h *harness) {
		hdr := map[string]string{"X-Mock-Fault": "lost_response", "X-Mock-Fault-First-N": "1"}
		if resp, err := h.doCtx(t.Context(), http.MethodPost, "/v1/chat/completions", chatReq(t, nil), hdr); err == nil {
			resp.Body.Close()
			t.Fatalf("first request answered %d", resp.StatusCode)
		}
		resp, data := h.chat(t, chatReq(t, nil), hdr)
		if resp.StatusCode != 200 || decode[wireCompletion](t, data).Usage.CompletionTokens != 3 {
			t.Errorf("second request: %d %s", resp.StatusCode, data)
		}
		if st := settle(t, h.srv); st != (Stats{Requests: 2, Completed: 2, Faults: 1}) {
			t.Errorf("stats %+v", st)
		}
	})
}
