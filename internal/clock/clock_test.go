package clock

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("a live context reported ended")
	}
	if !Sleep(context.Background(), 0) {
		t.Fatal("zero duration on a live context reported ended")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("a cancelled context did not cut the sleep short")
	}
	if Sleep(ctx, 0) {
		t.Fatal("zero duration on a cancelled context reported live")
	}
}
