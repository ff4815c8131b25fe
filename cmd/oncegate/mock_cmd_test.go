package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestMockServesNamedModels: `oncegate mock --models a,b` answers chat completions for those
// model names (a test points a gateway's OpenAI-compatible backend at it under any name) and
// refuses others.
func TestMockServesNamedModels(t *testing.T) {
	addr := testkit.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() {
		done <- mockMain(ctx, []string{"--listen", addr, "--models", "gpt-lb, oncegate-mock"}, &out, &errOut)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("mock exit %d: %s", code, errOut.String())
		}
	}()
	post := func(model string) (int, error) {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := post("gpt-lb")
		return err
	})
	for _, tc := range []struct {
		model string
		ok    bool
	}{{"gpt-lb", true}, {"oncegate-mock", true}, {"gpt-other", false}} {
		code, err := post(tc.model)
		if err != nil || (code == http.StatusOK) != tc.ok {
			t.Errorf("model %s: %d %v, want ok %v", tc.model, code, err, tc.ok)
		}
	}
}
