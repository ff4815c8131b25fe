package anthropic_test

import (
	"errors"
	"testing"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/anthropic"
)

// TestErrorEvent: an error event is the stream's failure, wrapping ErrStreamEvent with the
// backend's message; its frame is the event as it came (the relay does not relay it).
func TestErrorEvent(t *testing.T) {
	const data = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	s := anthropic.New().NewStream(dialect.StreamOptions{Model: "m"})
	out := s.Decode(dialect.Event{Name: "error", Data: []byte(data)}, nil)
	var ee *dialect.EventError
	if !errors.Is(out.Err, anthropic.ErrStreamEvent) || !errors.As(out.Err, &ee) || ee.Message != "Overloaded" {
		t.Errorf("Err = %v, want ErrStreamEvent with the message Overloaded", out.Err)
	}
	if out.Token || string(out.Frame) != "event: error\ndata: "+data+"\n\n" {
		t.Errorf("Decode = %+v", out)
	}
	if out := s.Decode(dialect.Event{Name: "ping", Data: []byte(`{"type":"ping"}`)}, nil); out.Err != nil {
		t.Errorf("a ping is an error: %v", out.Err)
	}
}
